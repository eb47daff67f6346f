"""`tide doctor`: scrape, rules, diagnosis."""
