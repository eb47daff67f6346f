"""``tide bench``: open-loop load against a running gateway, or a scenario preset that
starts its own local fleets and compares two arms side by side."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from tide_fleet.infra.cli.option_types import dtype_help, dtype_option

SCENARIOS = ("batching", "buckets", "prefix")


def _positive(name: str, kind: type = float, allow_inf: bool = False) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not value > 0 or (math.isinf(value) and not allow_inf) or math.isnan(value):
            limit = "> 0 (or inf)" if allow_inf else "> 0"
            raise argparse.ArgumentTypeError(f"{name} must be {limit}, got {text!r}")
        return value

    return parse


def _lengths(name: str) -> Any:
    def parse(text: str) -> tuple[int, int]:
        prompt, _, output = text.partition(":")
        try:
            p, o = int(prompt), int(output)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be PROMPT:OUTPUT token medians, got {text!r}"
            ) from None
        if p < 1 or o < 1:
            raise argparse.ArgumentTypeError(f"{name} medians must be >= 1, got {text!r}")
        return p, o

    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"--long-fraction must be in [0, 1], got {text!r}")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="open-loop load benchmark against a gateway, or a side-by-side scenario",
        description="Send requests on a Poisson/gamma schedule (open loop) and report TTFT, "
        "TPOT, inter-token latency, end-to-end latency and queue time (p50/p90/p99), "
        "throughput and goodput. --scenario starts its own local fleets instead of --url.",
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="gateway base URL")
    p.add_argument("--api-key", default=None, help="bearer key (when the gateway requires one)")
    p.add_argument(
        "--api",
        choices=["jobs", "completions"],
        default="jobs",
        help="jobs: POST /v1/jobs + its SSE events; completions: OpenAI /v1/completions stream",
    )
    p.add_argument(
        "--priority",
        choices=["interactive", "batch"],
        default=None,
        help="jobs API priority (default interactive, or the scenario's); batch jobs stream "
        "no tokens, so TTFT comes from the job record",
    )
    p.add_argument(
        "--scenario",
        choices=SCENARIOS,
        default=None,
        help="batching: continuous vs static; buckets: two pools vs one FIFO queue (p99 TTFT "
        "of short jobs); prefix: prefix caching on vs off (TTFT)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="scenarios: the model served (HF folder or "
        "dummy:PRESET; default stories260K if present, else dummy:tiny); else only "
        "its tokenizer is used to size prompts (default: the gateway's model)",
    )
    load = p.add_argument_group("load")
    load.add_argument(
        "--request-rate",
        type=_positive("--request-rate", allow_inf=True),
        default=None,
        help="requests/s (inf = all at once); default 5, or the scenario's",
    )
    load.add_argument(
        "--burstiness",
        type=_positive("--burstiness"),
        default=None,
        help="gamma shape of the gaps: 1 = Poisson (default, or the scenario's), < 1 "
        "burstier, > 1 smoother",
    )
    load.add_argument(
        "--num-requests",
        type=_positive("--num-requests", int),
        default=None,
        help="requests to send (default 50, or the scenario's)",
    )
    load.add_argument(
        "--duration",
        type=_positive("--duration"),
        default=None,
        help="stop sending after this many seconds",
    )
    load.add_argument("--seed", type=int, default=0, help="workload seed (lengths, arrivals)")
    load.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="JSONL: {prompt | prompt_len, max_tokens, offset?} per line",
    )
    load.add_argument(
        "--long-fraction", type=_fraction, default=None, help="share of long requests (default 0.2)"
    )
    load.add_argument(
        "--short-len",
        type=_lengths("--short-len"),
        default=None,
        metavar="P:O",
        help="short prompt:output token medians",
    )
    load.add_argument(
        "--long-len",
        type=_lengths("--long-len"),
        default=None,
        metavar="P:O",
        help="long prompt:output token medians",
    )
    load.add_argument(
        "--sigma",
        type=_positive("--sigma"),
        default=0.6,
        help="lognormal sigma of the lengths (heavier tail when larger)",
    )
    load.add_argument(
        "--max-len",
        type=_positive("--max-len", int),
        default=None,
        help="cap on prompt + output tokens (default: the model's context)",
    )
    load.add_argument(
        "--shared-prefix-len",
        type=int,
        default=None,
        help="every prompt starts with the same text of this many tokens",
    )
    load.add_argument("--temperature", type=float, default=0.0)
    load.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="generate exactly max_tokens (default on)",
    )
    load.add_argument("--request-timeout", type=_positive("--request-timeout"), default=600.0)
    out = p.add_argument_group("output")
    out.add_argument(
        "--goodput",
        nargs="+",
        default=[],
        metavar="METRIC:MS",
        help="SLOs for goodput, e.g. ttft:500 tpot:50 (also e2e)",
    )
    out.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="write bench.json (or scenario.json) and PNG plots here",
    )
    out.add_argument("--no-plots", action="store_true")
    out.add_argument("--no-progress", action="store_true")
    out.add_argument("--json", action="store_true", help="print the summary as JSON")
    fleet = p.add_argument_group("scenario fleets")
    fleet.add_argument(
        "--max-num-seqs",
        type=_positive("--max-num-seqs", int),
        default=None,
        help="per worker (default: the scenario's)",
    )
    fleet.add_argument(
        "--repeat",
        type=_positive("--repeat", int),
        default=None,
        help="rounds of both arms, alternating order; the ratio of the medians is reported "
        "(default: the scenario's, 3 for batching, else 1)",
    )
    fleet.add_argument(
        "--dtype",
        type=dtype_option("float32", "bfloat16"),
        default=None,
        metavar="DTYPE",
        help=f"the workers' dtype: {dtype_help('float32', 'bfloat16')}",
    )
    fleet.add_argument(
        "--keep-logs", action="store_true", help="keep the fleets' logs under --out-dir/logs"
    )
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from tide_fleet.infra.bench.load import RunConfig, run_load
    from tide_fleet.infra.bench.report import build_report, emit, parse_slos, report_config
    from tide_fleet.infra.bench.workload import build_workload, workload_spec

    try:
        slos = parse_slos(args.goodput)
        if args.priority == "batch" and args.api != "jobs":
            raise ValueError("--priority batch needs --api jobs (completions are interactive)")
        if args.scenario:
            return _scenario(args, slos)
        tokenizer, max_len = _tokenizer(args)
        spec = workload_spec(args, max_len, defaults={})
        items = build_workload(spec, tokenizer)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cfg = RunConfig(
        url=args.url.rstrip("/"),
        api=args.api,
        api_key=args.api_key,
        duration=args.duration,
        request_timeout=args.request_timeout,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        priority=args.priority or "interactive",
        progress=not args.no_progress and sys.stderr.isatty(),
    )
    result = run_load(items, cfg)
    report = build_report(result, slos, report_config(args, spec))
    emit(report, args, "bench.json", {"run": result})
    return 0 if report["summary"]["requests"]["completed"] else 1


def _scenario(args: argparse.Namespace, slos: dict[str, float]) -> int:
    from tide_fleet.infra.bench.scenarios import default_model, run_scenario
    from tide_fleet.infra.jobs.submission import ModelInfo
    from tide_fleet.worker.models.resolve import resolve_model_path  # torch: only in this parent

    model = args.model or default_model(args.scenario)
    resolve_model_path(model)  # materialise a dummy model once, before the fleets start
    info = ModelInfo.load(model)
    return run_scenario(args, slos, model, info.tokenizer, info.config.max_model_len)


def _tokenizer(args: argparse.Namespace) -> tuple[Any | None, int]:
    """The served model's tokenizer (to size prompts exactly) and its context length."""
    from tide_fleet.infra.jobs.submission import ModelInfo

    model = args.model
    if model is None:
        import httpx

        try:
            headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
            r = httpx.get(f"{args.url.rstrip('/')}/v1/models", headers=headers, timeout=10)
            model = r.json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
            raise ValueError(f"cannot reach the gateway at {args.url} ({e})") from None
    try:
        info = ModelInfo.load(model)
    except (OSError, ValueError) as e:
        print(
            f"note: no tokenizer for {model!r} here ({e}); prompt lengths are estimates "
            "(one token per word); pass --model FOLDER",
            file=sys.stderr,
        )
        return None, args.max_len or 2048
    return info.tokenizer, info.config.max_model_len
