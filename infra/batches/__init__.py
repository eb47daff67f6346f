"""OpenAI-format batches: store, validation and fan-out, supervision, finalize."""
