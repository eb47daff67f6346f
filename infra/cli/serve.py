"""The long-running commands: ``tide up``, ``worker``, ``reaper`` and ``controller``.

Their imports sit in the functions: the engine and the fleet load only for the command that
runs them, not for every ``tide`` invocation.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from tide_fleet.infra.cli.engine_flags import add_engine_flags, engine_kwargs, worker_argv
from tide_fleet.infra.cli.lora_options import add_lora_option


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser(
        "up",
        help="start a local fleet: Redis, gateway, controller (scales workers), webhook sender",
        description="Start the embedded fleet (Redis unless REDIS_URL is set): gateway, Celery "
        "webhook/batch sender, and the controller, which starts and drains worker processes "
        "with the queue and hosts the reaper. Ctrl-C stops it.",
    )
    up.add_argument(
        "--model", action="append", default=None,
        help="HF folder or dummy:PRESET (default: settings); repeat it to serve several "
        "models, each with its own pool (the first is the default; NAME=PATH names one)",
    )  # fmt: skip
    add_lora_option(up)
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
    add_engine_flags(up)
    up.set_defaults(func=cmd_up)

    wk = sub.add_parser(
        "worker",
        help="run one worker: pull jobs from its buckets into an engine",
        description="Consume the given buckets (preference order), interactive before batch.",
    )
    wk.add_argument("--pool", default="default")
    wk.add_argument("--buckets", default="short,medium,long", help="comma-separated, in order")
    wk.add_argument("--model", default=None, help="HF folder or dummy:PRESET (default: settings)")
    wk.add_argument(
        "--served-model", default=None,
        help="the name clients use for its model (TIDE_SERVED_MODELS); it takes only that "
        "model's queues (default: the served model with these weights, else the default one)",
    )  # fmt: skip
    wk.add_argument("--worker-id", default=None, help="default: <pool>-<host>-<pid>")
    add_engine_flags(wk)
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
    add_engine_flags(ct)
    ct.set_defaults(func=cmd_controller)


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT: the loops of the reaper and controller end on it."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def cmd_up(args: argparse.Namespace) -> int:
    from tide_fleet.infra.fleet.fleet_config import split_model_spec
    from tide_fleet.infra.fleet.local_fleet import LocalFleet
    from tide_fleet.infra.settings import Settings
    from tide_fleet.worker.models.resolve import resolve_model_path

    paths = [split_model_spec(m)[1] for m in args.model or []]
    overrides = {"model": paths[0] if paths else None, "data_dir": args.data_dir}
    settings = Settings(**{k: v for k, v in overrides.items() if v})
    for path in paths or [settings.model]:  # materialise dummy models once, before children
        resolve_model_path(path)
    return LocalFleet(args, settings, worker_argv(args)).run()


def cmd_worker(args: argparse.Namespace) -> int:
    from tide_fleet.infra.fleet.aws_lifecycle import LifecycleWatcher
    from tide_fleet.infra.fleet.fleet_adapters import slot_rank
    from tide_fleet.infra.settings import get_settings
    from tide_fleet.infra.wire.models import catalog
    from tide_fleet.worker.engine import LLMEngine
    from tide_fleet.worker.service import WorkerService

    settings = get_settings()
    served = catalog(settings).for_worker(args.served_model, args.model)
    if args.max_lora_rank is None:  # the largest rank its model's adapters declare
        args.max_lora_rank = slot_rank(served, settings.cache_dir)
    if args.tensor_parallel_size > 1:  # LoRA slots are not split over the ranks
        if served.adapters:
            names = ", ".join(a for a, _ in served.adapters)
            print(f"error: --tensor-parallel-size {args.tensor_parallel_size}: model "
                  f"{served.name} declares LoRA adapters ({names}), which are served only "
                  "at --tensor-parallel-size 1", file=sys.stderr)  # fmt: skip
            return 2
        args.max_loras = 0
    engine = LLMEngine.from_pretrained(served.path, **engine_kwargs(args))
    buckets = [b.strip() for b in args.buckets.split(",") if b.strip()]
    service = WorkerService(engine, settings, args.pool, buckets, worker_id=args.worker_id,
                            model=served.name, lane=served.lane)  # fmt: skip
    service.install_signal_handlers()
    watcher = None
    if LifecycleWatcher.enabled(settings):  # on EC2: drain when the ASG terminates us
        watcher = LifecycleWatcher(settings, on_terminate=service.drain)
        watcher.start()
    service.run()
    engine.close()  # a tensor-parallel worker's other ranks
    if watcher is not None:
        watcher.stop()
        watcher.complete()
    return 0


def cmd_reaper(args: argparse.Namespace) -> int:
    from tide_fleet.infra.fleet.reaper import run_reaper
    from tide_fleet.infra.settings import get_settings

    run_reaper(get_settings(), stop_on_signals())
    return 0


def cmd_controller(args: argparse.Namespace) -> int:
    import redis

    from tide_fleet.infra.fleet.aws_actuator import AwsActuator
    from tide_fleet.infra.fleet.controller import Controller
    from tide_fleet.infra.fleet.fleet_config import load_fleet
    from tide_fleet.infra.fleet.local_actuator import LocalActuator
    from tide_fleet.infra.fleet.pool_gpus import check_flag_agrees
    from tide_fleet.infra.settings import child_env, get_settings

    settings = get_settings()
    if not settings.redis_url:
        print("error: tide controller needs REDIS_URL", file=sys.stderr)
        return 2
    try:
        fleet = load_fleet(args.fleet)
        kind = args.actuator or fleet.controller.actuator
        if kind != "aws":  # its engine flags reach local workers only
            gpus = {p.name: p.gpus_per_worker for p in fleet.pools.values()}
            check_flag_agrees(gpus, args.tensor_parallel_size)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if fleet.needs_served_models():  # its workers learn the served models and adapters
        settings = settings.model_copy(
            update={"served_models": fleet.served_models(settings.model)}
        )
    client = redis.Redis.from_url(settings.redis_url)
    actuator: Any
    if kind == "aws":
        actuator = AwsActuator(fleet, client, endpoint_url=args.aws_endpoint_url)
    else:
        actuator = LocalActuator(fleet, env=child_env(settings), worker_argv=worker_argv(args))
    stop = stop_on_signals()
    controller = Controller(fleet, settings, actuator, client)
    controller.run(stop, metrics_port=args.metrics_port, metrics_host=args.metrics_host)
    return 0
