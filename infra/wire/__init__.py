"""The wire: job schema, queues, Redis keys, the job store and its scripts, backlog,
heartbeats. Torch-free."""
