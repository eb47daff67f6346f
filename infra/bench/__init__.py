"""The load bench (``tide bench``, docs/benchmarks.md):

- workload.py: what to send (arrivals, lengths, prompts, a request trace), from the flags;
- load.py: the open-loop client that sends it and records each request;
- report.py: statistics, goodput, the JSON report and its summary lines;
- plots.py: latency CDFs and the timeline;
- scenarios.py: presets that start two local fleets and compare them side by side;
- scenario_fleet.py: one arm's local fleet (Redis, gateway, workers) as child processes.
"""
