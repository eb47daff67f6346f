"""The load bench: workload, HTTP client, statistics, plots, scenarios."""
