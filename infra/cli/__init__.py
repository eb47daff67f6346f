"""The `tide` command: the composition root."""
