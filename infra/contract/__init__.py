"""What the gateway and the worker agree on about a request, torch-free: sampling
parameters, structured-output specs, the model's folder and config, its tokenizer and chat
template. The gateway checks and counts a request with these; the worker runs it with the
same ones, so what is accepted at the door is what the engine does.

Below everything but the wire, the planner and settings: a job's path from the gateway to
the queue (gateway -> infra.jobs -> infra.contract -> infra.wire) only goes down.
"""
