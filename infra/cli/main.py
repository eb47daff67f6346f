"""The ``tide`` command line."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from typing import Any

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


SUBCOMMAND_MODULES = (
    "infra.cli.batch",
    "infra.cli.bench",
    "infra.cli.plan",
    "infra.cli.doctor",
    "infra.cli.infra",
    "infra.cli.simulate",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tide", description="Tide: a queue-driven LLM fleet.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser(
        "generate",
        help="run prompts through one in-process engine (continuous batching)",
        description="Generate completions for one or more prompts, all batched in one engine.",
    )
    gen.add_argument("--model", default="dummy:tiny", help="HF folder or dummy:PRESET")
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
    gen.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    gen.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    gen.add_argument("--kv-cache-memory", type=int, default=None, help="KV pool size in bytes")
    gen.add_argument("--max-num-seqs", type=int, default=64)
    gen.add_argument("--max-num-batched-tokens", type=int, default=1024)
    gen.add_argument("--no-prefix-caching", action="store_true")
    gen.add_argument(
        "--attention-backend", choices=["auto", "torch", "cpp", "triton"], default="auto",
        help="auto: Triton on CUDA, the native C++ kernel on CPU (torch reference where it "
        "cannot be built)",
    )  # fmt: skip
    gen.add_argument("--json", action="store_true", help="one JSON object per prompt on stdout")
    gen.set_defaults(func=cmd_generate)

    up = sub.add_parser(
        "up",
        help="start a local fleet: Redis, gateway, controller (scales workers), webhook sender",
        description="Start the embedded fleet (Redis unless REDIS_URL is set): gateway, Celery "
        "webhook/batch sender, and the controller, which starts and drains worker processes "
        "with the queue and hosts the reaper. Ctrl-C stops it.",
    )
    up.add_argument("--model", default=None, help="HF folder or dummy:PRESET (default: settings)")
    up.add_argument("--workers", type=int, default=1, help="fixed pool size (min = max)")
    up.add_argument("--min-workers", type=int, default=None, help="autoscale from this (e.g. 0)")
    up.add_argument("--max-workers", type=int, default=None, help="autoscale up to this")
    up.add_argument(
        "--fleet", default=None,
        help="fleet.toml with pools (local actuator); overrides --workers/--min/--max",
    )  # fmt: skip
    up.add_argument("--port", type=int, default=8000)
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--data-dir", default=None, help="embedded Redis AOF folder (default .tide)")
    _engine_flags(up)
    up.set_defaults(func=cmd_up)

    wk = sub.add_parser(
        "worker",
        help="run one worker: pull jobs from its buckets into an engine",
        description="Consume the given buckets (preference order), interactive before batch.",
    )
    wk.add_argument("--pool", default="default")
    wk.add_argument("--buckets", default="short,medium,long", help="comma-separated, in order")
    wk.add_argument("--model", default=None, help="HF folder or dummy:PRESET (default: settings)")
    wk.add_argument("--worker-id", default=None, help="default: <pool>-<host>-<pid>")
    _engine_flags(wk)
    wk.set_defaults(func=cmd_worker)

    rp = sub.add_parser(
        "reaper", help="re-queue jobs whose worker lease expired (the controller runs one too)"
    )
    rp.set_defaults(func=cmd_reaper)

    ct = sub.add_parser(
        "controller",
        help="scale worker pools with their queues (local processes or AWS Auto Scaling)",
        description="Every poll interval: read backlogs and heartbeats, decide per pool, act. "
        "Also runs the lease reaper and the batch supervisor.",
    )
    ct.add_argument("--fleet", default="fleet.toml", help="pools declaration (fleet.toml)")
    ct.add_argument("--actuator", choices=["local", "aws"], default=None,
                    help="default: [controller] actuator in the fleet file")  # fmt: skip
    ct.add_argument("--metrics-port", type=int, default=9300, help="0 = any free port")
    ct.add_argument("--metrics-host", default="127.0.0.1", help="0.0.0.0 for Prometheus")
    ct.add_argument("--aws-endpoint-url", default=None, help="AWS endpoint (tests: moto)")
    _engine_flags(ct)
    ct.set_defaults(func=cmd_controller)

    sm = sub.add_parser("submit", help="submit a job to a running gateway")
    sm.add_argument("text")
    sm.add_argument("--max-tokens", type=int, default=64)
    sm.add_argument("--temperature", type=float, default=0.0)
    sm.add_argument("--wait", action="store_true", help="poll until the job ends; print its text")
    _client_flags(sm)
    sm.set_defaults(func=cmd_submit)

    st = sub.add_parser("status", help="show a job")
    st.add_argument("job_id")
    _client_flags(st)
    st.set_defaults(func=cmd_status)

    # Each of these modules has add_parser(sub) that registers its own subcommand(s).
    for module in SUBCOMMAND_MODULES:
        importlib.import_module(module).add_parser(sub)
    return parser


def _engine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--kv-cache-memory", type=int, default=None, help="KV pool size in bytes")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument(
        "--attention-backend", choices=["auto", "torch", "cpp", "triton"], default="auto",
        help="auto: Triton on CUDA, the native C++ kernel on CPU",
    )  # fmt: skip
    p.add_argument("--no-prefix-caching", action="store_true", help="turn the prefix cache off")
    p.add_argument(
        "--batching", choices=["continuous", "static"], default="continuous",
        help="static: admit only into an empty engine, run each batch to completion (baseline)",
    )  # fmt: skip


def _client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="gateway base URL")
    p.add_argument("--api-key", default=None, help="bearer key (when the gateway requires one)")


def _load_prompts(args: argparse.Namespace) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"prompt": p} for p in args.prompt]
    if args.prompts_file:
        from infra.jsonl import iter_objects

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
    from worker.engine import LLMEngine, SamplingParams
    from worker.models.config import ModelLoadError

    items = _load_prompts(args)
    try:
        engine = LLMEngine.from_pretrained(
            args.model,
            dtype=args.dtype,
            device=args.device,
            kv_cache_memory=args.kv_cache_memory,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_prefix_caching=not args.no_prefix_caching,
            attention_backend=args.attention_backend,
        )
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
            record = {
                "prompt": item["prompt"],
                "text": out.text,
                "prompt_token_ids": out.prompt_token_ids,
                "token_ids": out.token_ids,
                "finish_reason": out.finish_reason,
            }
            if out.error:
                record["error"] = out.error
            print(json.dumps(record, ensure_ascii=False))
        else:
            print(f"{item['prompt']}{out.text}\n[{out.finish_reason}, {len(out.token_ids)} tokens]")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from infra.settings import get_settings
    from worker.engine import LLMEngine
    from worker.service import WorkerService

    settings = get_settings()
    model = args.model or settings.model
    engine = LLMEngine.from_pretrained(
        model,
        dtype=args.dtype,
        device=args.device,
        kv_cache_memory=args.kv_cache_memory,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        attention_backend=args.attention_backend,
        enable_prefix_caching=not args.no_prefix_caching,
        batching=args.batching,
    )
    buckets = [b.strip() for b in args.buckets.split(",") if b.strip()]
    service = WorkerService(engine, settings, args.pool, buckets, worker_id=args.worker_id)
    service.install_signal_handlers()
    from infra.fleet.aws_lifecycle import LifecycleWatcher

    watcher = None
    if LifecycleWatcher.enabled(settings):  # on EC2: drain when the ASG terminates us
        watcher = LifecycleWatcher(settings, on_terminate=service.drain)
        watcher.start()
    service.run()
    if watcher is not None:
        watcher.stop()
        watcher.complete()
    return 0


def cmd_reaper(args: argparse.Namespace) -> int:
    import signal
    import threading

    from infra.fleet.reaper import run_reaper
    from infra.settings import get_settings

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    run_reaper(get_settings(), stop)
    return 0


def cmd_controller(args: argparse.Namespace) -> int:
    import signal
    import threading

    import redis

    from infra.fleet.actuators import AwsActuator, LocalActuator
    from infra.fleet.controller import Controller
    from infra.fleet.fleet_config import load_fleet
    from infra.settings import get_settings

    settings = get_settings()
    if not settings.redis_url:
        print("error: tide controller needs REDIS_URL", file=sys.stderr)
        return 2
    try:
        fleet = load_fleet(args.fleet)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    client = redis.Redis.from_url(settings.redis_url)
    kind = args.actuator or fleet.controller.actuator
    actuator: Any
    if kind == "aws":
        actuator = AwsActuator(fleet, client, endpoint_url=args.aws_endpoint_url)
    else:
        from infra.fleet.local_fleet import engine_argv

        actuator = LocalActuator(fleet, worker_argv=engine_argv(args))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    controller = Controller(fleet, settings, actuator, client)
    controller.run(stop, metrics_port=args.metrics_port, metrics_host=args.metrics_host)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from infra.fleet.local_fleet import LocalFleet

    return LocalFleet(args).run()


def _client(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """A client for the gateway at --url, as a context manager: a gateway it cannot reach
    ends the command with one line (the URL it tried, how to choose another), exit code 2."""
    import contextlib

    import httpx

    @contextlib.contextmanager
    def client():  # type: ignore[no-untyped-def]
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        try:
            with httpx.Client(base_url=args.url, headers=headers, timeout=30) as c:
                yield c
        except (httpx.TransportError, httpx.InvalidURL, httpx.UnsupportedProtocol) as e:
            flags = argparse.ArgumentParser()
            _client_flags(flags)
            default = flags.get_default("url")
            chosen = "the default" if args.url == default else f"from --url; default {default}"
            reason = str(e).rstrip(".") or type(e).__name__
            print(
                f"error: cannot reach the gateway at {args.url} ({chosen}): {reason}; start "
                "one (tide up) or pass --url URL",
                file=sys.stderr,
            )
            raise SystemExit(2) from None

    return client()


def cmd_submit(args: argparse.Namespace) -> int:
    import time

    with _client(args) as client:
        body = {"prompt": args.text, "max_tokens": args.max_tokens, "temperature": args.temperature}
        r = client.post("/v1/jobs", json=body)
        if r.status_code != 202:
            print(f"error: {r.status_code} {r.text}", file=sys.stderr)
            return 1
        job = r.json()
        if not args.wait:
            print(json.dumps(job))
            return 0
        while True:
            job = client.get(f"/v1/jobs/{job['id']}").json()
            if job["status"] not in ("queued", "in_progress"):
                break
            time.sleep(0.1)
        print(json.dumps(job, indent=2))
        return 0 if job["status"] == "completed" else 1


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        r = client.get(f"/v1/jobs/{args.job_id}")
    if r.status_code != 200:
        print(f"error: {r.status_code} {r.text}", file=sys.stderr)
        return 1
    print(json.dumps(r.json(), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    # Before torch loads: its CPU allocator then backs tensors of 2 MiB and more with
    # transparent huge pages, which lifts streaming reads of weights and KV blocks by
    # about a quarter here (no TLB walk per 4 KiB page). THP_MEM_ALLOC_ENABLE=0 opts out.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
