"""Llama-family model code: weight loading, the forward pass, random-weight models (the
model's config, tokenizer and folder resolution are in ``infra.contract``)."""
