"""A GGUF file's tokenizer as the ``tokenizers`` library's, with its config files.

GGUF stores the vocabulary (``tokenizer.ggml.tokens``, each token's type), the BPE merges,
the special token ids, whether to add BOS, the chat template, and the name of the
pre-tokenizer its merges were learned with (``tokenizer.ggml.pre``). Byte-level BPE
vocabularies (``tokenizer.ggml.model = gpt2``: GPT-2, Llama 3, Qwen2, SmolLM) are built as
``tokenizers`` BPE models: control tokens (type 3) become special added tokens, user-defined
ones (type 4) plain added tokens, and the text is split before BPE with the pre-tokenizer's
regular expressions as llama.cpp applies them. A SentencePiece vocabulary
(``tokenizer.ggml.model = llama``: Llama 2, Mistral 7B) or a pre-tokenizer not listed
here is refused, naming it.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from tide_fleet.infra.contract.model_config import ModelLoadError

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types

# The splits that llama.cpp applies before byte-level BPE, by the file's pre-tokenizer name.
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DIGITS = r"\p{N}"  # each digit alone, then GPT-2's split
SPLITS: dict[str, tuple[str, ...]] = {
    "default": (GPT2,),
    "gpt2": (GPT2,),
    "smollm": (DIGITS, GPT2),
    "starcoder": (DIGITS, GPT2),
    "refact": (DIGITS, GPT2),
    "llama-bpe": (LLAMA3,),
    "llama3": (LLAMA3,),
    "llama-v3": (LLAMA3,),
    "smaug-bpe": (LLAMA3,),
    "dbrx": (LLAMA3,),
    "qwen2": (QWEN2,),
    "deepseek-r1-qwen": (QWEN2,),
}


def field(reader: Any, name: str, default: Any = None) -> Any:
    f = reader.fields.get(name)
    return default if f is None else f.contents()


def tokenizer_files(reader: Any) -> tuple[HFTokenizer, dict[str, Any], dict[str, Any]]:
    """(the tokenizer, tokenizer_config.json, generation_config.json) of a GGUF reader."""
    kind = field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        what = "SentencePiece" if kind == "llama" else "this"
        raise ModelLoadError(
            f"GGUF tokenizer model {kind!r}: {what} vocabulary is not supported (Tide builds "
            "byte-level BPE vocabularies, tokenizer.ggml.model = 'gpt2')"
        )
    pre = field(reader, "tokenizer.ggml.pre", "default")
    if pre not in SPLITS:
        raise ModelLoadError(
            f"GGUF pre-tokenizer {pre!r} is not supported (known: {', '.join(sorted(SPLITS))})"
        )
    tokens: list[str] = field(reader, "tokenizer.ggml.tokens")
    types: list[int] = field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges") or []]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in SPLITS[pre]]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    kinds = list(zip(tokens, types, strict=True))
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in kinds if k == CONTROL]
    )
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in kinds if k == USER_DEFINED]
    )

    def token(key: str) -> tuple[str | None, int | None]:
        i = field(reader, f"tokenizer.ggml.{key}_token_id")
        return (tokens[i], int(i)) if i is not None and 0 <= i < len(tokens) else (None, None)

    bos, bos_id = token("bos")
    eos, eos_id = token("eos")
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", False)) and bos is not None
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    eot = token("eot")[1]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token("unknown")[0],
        "pad_token": token("padding")[0],
        "add_bos_token": add_bos,
        "chat_template": field(reader, "tokenizer.chat_template"),
    }
    stop = [eos_id] + ([eot] if eot is not None and eot != eos_id else [])
    generation = {"bos_token_id": bos_id, "eos_token_id": stop[0] if len(stop) == 1 else stop}
    return tok, {k: v for k, v in config.items() if v is not None}, generation
