"""OpenAI-format batches: the record (store), validation and fan-out (validate), following
(supervise), the output files (finalize), and documents split into batch lines (docs)."""
