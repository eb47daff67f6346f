"""``tide generate``: prompts through one in-process engine (continuous batching)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tide_fleet.infra.cli.engine_flags import GENERATE_FLAGS, add_engine_flags, engine_kwargs
from tide_fleet.infra.jsonl import iter_objects
from tide_fleet.infra.settings import DEFAULT_MODEL

GENERATE_OVERRIDES = {
    "max_tokens": int,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "seed": int,
    "stop": list,
    "stop_token_ids": list,
    "ignore_eos": bool,
}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    gen = sub.add_parser(
        "generate",
        help="run prompts through one in-process engine (continuous batching)",
        description="Generate completions for one or more prompts, all batched in one engine.",
    )
    gen.add_argument("--model", default=DEFAULT_MODEL,
                     help="HF folder, .gguf file, bundled name or dummy:PRESET")  # fmt: skip
    gen.add_argument("--prompt", action="append", default=[], help="a prompt; repeatable")
    gen.add_argument(
        "--prompts-file",
        help='JSONL: {"prompt": TEXT} per line, plus optional overrides '
        f"({', '.join(GENERATE_OVERRIDES)})",
    )
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1, help="-1 = off")
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=[], help="stop string; repeatable")
    gen.add_argument("--ignore-eos", action="store_true")
    add_engine_flags(gen, GENERATE_FLAGS)
    gen.add_argument("--json", action="store_true", help="one JSON object per prompt on stdout")
    gen.set_defaults(func=cmd_generate)


def _load_prompts(args: argparse.Namespace) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"prompt": p} for p in args.prompt]
    if args.prompts_file:
        try:
            for n, item in iter_objects(args.prompts_file, {"prompt", *GENERATE_OVERRIDES}):
                if not isinstance(item.get("prompt"), str):
                    raise ValueError(f'{args.prompts_file}:{n}: needs a string field "prompt"')
                items.append(item)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    if not items:
        raise SystemExit("no prompts: give --prompt TEXT or --prompts-file FILE.jsonl")
    return items


def cmd_generate(args: argparse.Namespace) -> int:
    from tide_fleet.infra.contract.model_config import ModelLoadError
    from tide_fleet.worker.engine import LLMEngine, SamplingParams

    items = _load_prompts(args)
    try:
        engine = LLMEngine.from_pretrained(args.model, **engine_kwargs(args, GENERATE_FLAGS))
    except (ModelLoadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    assert engine.tokenizer is not None
    if args.model.startswith("dummy:"):
        print(f"note: {args.model} has random weights; its text is meaningless", file=sys.stderr)
    base = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "seed": args.seed,
        "stop": args.stop,
        "ignore_eos": args.ignore_eos,
    }
    prompts, params = [], []
    for n, item in enumerate(items, 1):
        try:
            p = SamplingParams(**{**base, **{k: v for k, v in item.items() if k != "prompt"}})
            ids = engine.tokenizer.encode(item["prompt"])
            engine.validate(len(ids), p)
        except ValueError as e:
            print(f"error: prompt {n}: {e}", file=sys.stderr)
            return 2
        prompts.append(ids)
        params.append(p)
    for item, out in zip(items, engine.generate(prompts, params), strict=True):
        if args.json:
            print(json.dumps(_record(item, out), ensure_ascii=False))
        else:
            print(f"{item['prompt']}{out.text}\n[{out.finish_reason}, {len(out.token_ids)} tokens]")
    return 0


def _record(item: dict[str, Any], out: Any) -> dict[str, Any]:
    record = {
        "prompt": item["prompt"],
        "text": out.text,
        "prompt_token_ids": out.prompt_token_ids,
        "token_ids": out.token_ids,
        "finish_reason": out.finish_reason,
    }
    if out.error:
        record["error"] = out.error
    return record
