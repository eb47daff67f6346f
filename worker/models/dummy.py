"""Random-weight Llama models built in code from a seed, saved as Hugging Face folders.

``dummy:<preset>`` names one; the first use writes it under ``$TIDE_CACHE_DIR``
(default ``~/.cache/tide``) so Tide and transformers load the very same weights.
The tokenizer is byte-level (256 byte tokens plus 4 specials): every string encodes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from tide_fleet.infra.contract.model_config import ModelLoadError
from tide_fleet.infra.contract.registry import DEFAULT_SEED
from tide_fleet.infra.contract.tokenizer import byte_level_alphabet

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
NUM_SPECIALS = len(SPECIALS)

# A minimal role-tagged template, so chat routes work on dummy models too.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

PRESETS: dict[str, dict[str, Any]] = {
    # Tests: small enough that a forward pass is a millisecond.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024),
    # A little deeper, for service and scheduler tests that want visible compute.
    "small": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048),
    # Benchmarks: about 100M parameters, GQA 4:1, head_dim 64.
    "bench": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=9,
                  num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096),
}  # fmt: skip


def build_byte_tokenizer() -> Tokenizer:
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch, b in byte_level_alphabet().items():
        vocab[ch] = NUM_SPECIALS + b
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens(SPECIALS)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]
    )
    return tok


def hf_config(preset: str) -> dict[str, Any]:
    if preset not in PRESETS:
        raise ModelLoadError(f"unknown dummy preset {preset!r}; choose one of {', '.join(PRESETS)}")
    shape = PRESETS[preset]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": NUM_SPECIALS + 256,
        "head_dim": shape["hidden_size"] // shape["num_attention_heads"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "torch_dtype": "float32",
        **shape,
    }


def random_weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Normal(0, 0.02) matrices, ones for norms: a well-scaled model in bf16 and fp32."""
    gen = torch.Generator().manual_seed(seed)
    d, inter = config["hidden_size"], config["intermediate_size"]
    hd = config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd

    def mat(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) * 0.02

    weights = {"model.embed_tokens.weight": mat(config["vocab_size"], d)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": torch.ones(d),
            p + "self_attn.q_proj.weight": mat(q, d),
            p + "self_attn.k_proj.weight": mat(kv, d),
            p + "self_attn.v_proj.weight": mat(kv, d),
            p + "self_attn.o_proj.weight": mat(d, q),
            p + "post_attention_layernorm.weight": torch.ones(d),
            p + "mlp.gate_proj.weight": mat(inter, d),
            p + "mlp.up_proj.weight": mat(inter, d),
            p + "mlp.down_proj.weight": mat(d, inter),
        }
    weights["model.norm.weight"] = torch.ones(d)
    weights["lm_head.weight"] = mat(config["vocab_size"], d)
    return weights


def save_dummy(preset: str, out: str | Path, seed: int = DEFAULT_SEED) -> Path:
    """Write preset's random model as an HF folder (config, safetensors, tokenizer)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = hf_config(preset)
    save_file(random_weights(config, seed), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    build_byte_tokenizer().save(str(out / "tokenizer.json"))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID})
    )
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "add_bos_token": True,
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "model_max_length": config["max_position_embeddings"],
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    return out
