#!/usr/bin/env python3
"""Structured-output benchmark: the engine with every request held to a realistic invoice
extraction schema, against the same workload unconstrained, side by side in one run.

Each request is an invoice-like document (about 300-700 tokens of prompt) and asks for
the invoice as JSON. A first constrained pass gives each request's output length; each
unconstrained request then generates exactly as many tokens (ignore_eos), so both modes
do the same model work and the ratio of output tokens/s is the cost of structured
outputs: the masks (computed inline on CPU, the engine's choice there; --overlap-masks
adds a mode that computes them in a thread while the model runs, the choice on CUDA),
the mask applied to the logits, and the matcher advanced per token.

One engine per mode shares the loaded weights; they are stepped in turn, each step timed
on its own, so on a shared machine a neighbour's burst slows every mode alike rather than
one whole run (sequential runs here swung 2x from one to the next).

A random-weight model does not know JSON: inside a string it would pick the closing quote
once in ~200 tokens, so every output would be one long string. Both runs therefore carry
the same logit_bias (+6) on the quote token, so strings end after a few characters, as a
trained model's do, and masks are computed all over the schema's structure.

Also reported: the schema's validate() time (what the gateway pays), the cold compile for
the tokenizer (tokenizer setup + grammar), and the per-row mask time.

    python scripts/bench_structured.py                   # dummy:small, about 2 min
    python scripts/bench_structured.py --model dummy:bench --num-requests 32

The last line is one JSON object. Absolute numbers only mean something on a quiet
machine; compare the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as `tide` does, before torch loads

import torch

from tide_fleet.infra.contract.structured import StructuredOutput, validate
from tide_fleet.infra.contract.tokenizer import Tokenizer
from tide_fleet.worker.engine import EngineConfig, LLMEngine, SamplingParams
from tide_fleet.worker.engine.grammar import GrammarMatchers
from tide_fleet.worker.models.loader import load_model
from tide_fleet.worker.models.resolve import resolve_model_path

ADDRESS = {
    "type": "object",
    "properties": {
        "street": {"type": "string", "maxLength": 60},
        "city": {"type": "string", "maxLength": 40},
        "postal_code": {"type": "string", "pattern": "^[0-9A-Z -]{3,10}$"},
        "country": {"type": "string", "minLength": 2, "maxLength": 2},
    },
    "required": ["street", "city", "country"],
    "additionalProperties": False,
}
INVOICE_SCHEMA = {
    "type": "object",
    "properties": {
        "invoice_number": {"type": "string", "pattern": "^INV-[0-9]{4,8}$"},
        "issue_date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "due_date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "currency": {"enum": ["USD", "EUR", "GBP", "JPY", "CHF"]},
        "vendor": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 80},
                "tax_id": {"type": "string", "maxLength": 20},
                "address": ADDRESS,
            },
            "required": ["name", "address"],
            "additionalProperties": False,
        },
        "line_items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 8,
            "items": {
                "type": "object",
                "properties": {
                    "description": {"type": "string", "maxLength": 80},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 10000},
                    "unit_price": {"type": "number", "minimum": 0},
                    "amount": {"type": "number", "minimum": 0},
                },
                "required": ["description", "quantity", "unit_price", "amount"],
                "additionalProperties": False,
            },
        },
        "subtotal": {"type": "number", "minimum": 0},
        "tax": {"anyOf": [{"type": "number", "minimum": 0}, {"type": "null"}]},
        "total": {"type": "number", "minimum": 0},
        "paid": {"type": "boolean"},
        "notes": {"type": "string", "maxLength": 200},
    },
    "required": ["invoice_number", "issue_date", "currency", "vendor", "line_items", "total"],
    "additionalProperties": False,
}

WORDS = [
    "paper",
    "stapler",
    "toner",
    "ink",
    "desk",
    "chair",
    "cable",
    "monitor",
    "service",
    "hours",
    "license",
    "support",
]


def document(rng: random.Random) -> str:
    """An invoice as a document's text would show it: the thing to extract from."""
    lines = [
        f"INVOICE INV-{rng.randrange(10**4, 10**8)}",
        f"Date: 2024-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
        f"From: {rng.choice(['Acme', 'Globex', 'Initech', 'Umbrella'])} Supplies Ltd",
        f"{rng.randrange(1, 300)} {rng.choice(['High', 'Main', 'Station'])} Street, "
        f"{rng.choice(['Leeds', 'Berlin', 'Lyon', 'Austin'])} {rng.randrange(10000, 99999)}",
    ]
    for _ in range(rng.randint(3, 12)):
        qty, price = rng.randint(1, 50), rng.randrange(100, 50000) / 100
        item = " ".join(rng.sample(WORDS, 2))
        lines.append(f"{item:<24} {qty:>4} x {price:>8.2f} = {qty * price:>9.2f}")
    lines.append(f"Total due: {rng.randrange(100, 99999) / 100:.2f} EUR. Payment within 30 days.")
    return "\n".join(lines) + "\n\nExtract this invoice as JSON:\n"


def quote_bias(engine: LLMEngine) -> dict[int, float]:
    assert engine.tokenizer is not None
    ids = engine.tokenizer.encode('"', add_special_tokens=False)
    return {ids[-1]: 6.0}


def paired(engines: dict[str, LLMEngine], prompts, params: dict[str, list]) -> dict:
    """Step every engine in turn until all are done, timing each engine's own steps.

    Engines run one step at a time, never at once, so a neighbour's burst on a shared
    machine slows every mode alike instead of one whole run.
    """
    for name, engine in engines.items():
        for i, (prompt, sp) in enumerate(zip(prompts, params[name], strict=True)):
            engine.add_request(f"{name}-{time.monotonic_ns()}-{i}", prompt, sp)
    busy = dict.fromkeys(engines, 0.0)
    done: dict[str, list] = {name: [] for name in engines}
    before = {n: _mask_counters(e) for n, e in engines.items()}
    order = list(engines)
    while any(e.has_unfinished() for e in engines.values()):
        for name in order:
            engine = engines[name]
            if engine.has_unfinished():
                t = time.perf_counter()
                outs = engine.step()
                busy[name] += time.perf_counter() - t
                done[name].extend(o for o in outs if o.finished)
        order.reverse()  # neither mode always goes first
    result = {}
    for name, engine in engines.items():
        tokens = sum(len(o.token_ids) for o in done[name])
        num_masks, mask_s, wait_s = (
            a - b for a, b in zip(_mask_counters(engine), before[name], strict=True)
        )
        result[name] = {
            "tokens": tokens,
            "busy_s": busy[name],
            "tok_per_s": tokens / busy[name],
            "completed": sum(o.finish_reason == "stop" for o in done[name]),
            "complete_texts": [o.text for o in done[name] if o.finish_reason == "stop"],
            "mask_us_per_row": 1e6 * mask_s / max(num_masks, 1),
            "wait_ms": 1e3 * wait_s,
        }
    return result


def _mask_counters(engine: LLMEngine) -> tuple[float, float, float]:
    g = engine.grammar
    assert g is not None
    return (g.num_masks, g.mask_seconds, g.wait_seconds)


def compile_costs(engine: LLMEngine) -> dict:
    spec = StructuredOutput(json_schema=INVOICE_SCHEMA)
    t = time.perf_counter()
    validate(spec)
    validate_ms = 1e3 * (time.perf_counter() - t)
    assert engine.tokenizer is not None
    fresh = GrammarMatchers(
        engine.tokenizer.to_json(), engine.model.config.vocab_size, sorted(engine.eos_token_ids)
    )
    t = time.perf_counter()
    _ = fresh.tokenizer
    tokenizer_ms = 1e3 * (time.perf_counter() - t)
    fresh.add("a", spec)
    t = time.perf_counter()
    fresh.add("b", spec)  # a template hit: one deep copy
    copy_us = 1e6 * (time.perf_counter() - t)
    return {
        "validate_ms": validate_ms,
        "tokenizer_setup_ms": tokenizer_ms,
        "compile_ms": 1e3 * fresh.compile_seconds,
        "cached_matcher_us": copy_us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", default="dummy:small", help="HF folder or dummy:PRESET")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--overlap-masks", action="store_true", help="also time masks computed during the model"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = resolve_model_path(args.model)
    model, tokenizer = load_model(folder, args.dtype, "cpu"), Tokenizer(folder)
    modes = ["unconstrained", "structured"] + (["structured_overlap"] if args.overlap_masks else [])
    engines = {
        m: LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=args.max_num_seqs)) for m in modes
    }
    if "structured_overlap" in engines:
        grammar = engines["structured_overlap"].grammar
        assert grammar is not None
        grammar.overlap = True
    engine = engines["structured"]
    rng = random.Random(args.seed)
    prompts = [tokenizer.encode(document(rng)) for _ in range(args.num_requests)]
    bias = quote_bias(engine)
    costs = compile_costs(engine)
    constrained = [
        SamplingParams(
            max_tokens=args.max_tokens, temperature=1.0, seed=args.seed + i, logit_bias=bias,
            structured={"json_schema": INVOICE_SCHEMA},
        )
        for i in range(len(prompts))
    ]  # fmt: skip
    for e in engines.values():
        e.generate(prompts[:4], constrained[:4])  # warm-up (and the schema's compile)
    # One pass for the lengths the unconstrained requests must match, token for token.
    lengths = [len(o.token_ids) for o in engine.generate(prompts, constrained)]
    plain = [
        SamplingParams(
            max_tokens=n, temperature=1.0, seed=args.seed + i, logit_bias=bias, ignore_eos=True
        )
        for i, n in enumerate(lengths)
    ]
    params = {m: plain if m == "unconstrained" else constrained for m in modes}
    rounds = [paired(engines, prompts, params) for _ in range(args.rounds)]
    for r in rounds:
        for mode in modes[1:]:
            for text in r[mode]["complete_texts"]:
                json.loads(text)  # every completed output is JSON (the tests hold it to the schema)
    summary: dict = {"model": args.model, "num_requests": len(prompts), **costs}
    print(
        f"model {args.model}, {len(prompts)} requests, prompt tokens {sum(map(len, prompts))}, "
        f"output tokens {sum(lengths)} per mode and round, {args.rounds} paired rounds, "
        f"torch threads {args.threads}"
    )
    print(
        f"  schema: validate {costs['validate_ms']:.2f} ms, tokenizer setup "
        f"{costs['tokenizer_setup_ms']:.1f} ms (once per engine), compile "
        f"{costs['compile_ms']:.2f} ms (once per schema), then {costs['cached_matcher_us']:.1f} us "
        "per request"
    )
    for mode in modes:
        runs = [r[mode] for r in rounds]
        tokens, busy = sum(x["tokens"] for x in runs), sum(x["busy_s"] for x in runs)
        last = runs[-1]
        summary[mode] = {
            "tok_per_s": tokens / busy,
            "tok_per_s_rounds": [x["tok_per_s"] for x in runs],
            "completed": last["completed"],
            "mask_us_per_row": last["mask_us_per_row"],
            "wait_ms": last["wait_ms"],
        }
        line = f"  {mode:18s} {tokens / busy:8.1f} output tok/s"
        if mode != "unconstrained":
            line += (
                f"  ({last['completed']}/{len(prompts)} complete JSON, masks "
                f"{last['mask_us_per_row']:.1f} us/row, steps waited {last['wait_ms']:.0f} ms "
                f"of {last['busy_s']:.1f} s)"
            )
        print(line)
    base = summary["unconstrained"]["tok_per_s"]
    for mode in modes[1:]:
        ratio = summary[mode]["tok_per_s"] / base
        per_round = [r[mode]["tok_per_s"] / r["unconstrained"]["tok_per_s"] for r in rounds]
        summary[f"{mode}_over_unconstrained"] = ratio
        summary[f"{mode}_over_unconstrained_rounds"] = per_round
        rounds_text = ", ".join(f"{x:.3f}" for x in per_round)
        print(f"  {mode} / unconstrained: {ratio:.3f}x (rounds: {rounds_text})")
    print(json.dumps(summary, default=float))


if __name__ == "__main__":
    main()
