"""Shared plumbing and fleet control: CLI, settings, protocol, queues (torch-free)."""
