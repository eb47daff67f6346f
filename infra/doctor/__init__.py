"""`tide doctor`: scrapes, snapshots, the diagnosis rules, collecting from a live fleet."""
