"""The fleet simulator (``tide simulate``, docs/simulator.md), a policy judged on GPU-hours
and queue wait before it runs for real:

- models.py: the fleet's served models as traces name them (and their buckets);
- traces.py: the jobs (built-in seeded traces, job trace files), each of a model, bucketed;
- routing.py: per (model, bucket) queue, its home pool and the pools that serve it;
- service_model.py: how fast a worker serves its batch (planner roofline or measured curve);
- worker.py: one worker, processor sharing over its running jobs;
- simulation.py: the event loop for one policy over one trace;
- policies.py: tide (infra.fleet.autoscale.decide), list_length (KEDA-style), static_peak;
- results.py: what a run comes to (GPU-hours, waits, SLOs), in total and per model;
- compare.py: simulate(), every policy over the same trace.
"""
