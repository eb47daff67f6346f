"""The fleet simulator: traces, the service model, the event loop, policies."""
