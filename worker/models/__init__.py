"""Llama-family model code: config parsing, weight loading, tokenizer, random-weight models."""
