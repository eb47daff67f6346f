"""LoRA adapters in the engine: host cache and device slots (slots.py), per-step rows
(step.py), tensors laid out per fused projection (host.py)."""
