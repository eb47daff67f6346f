"""Tide worker: the queue consumer, the continuous-batching engine and the model code."""
