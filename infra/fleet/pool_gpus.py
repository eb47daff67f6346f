"""GPUs per worker: a pool's ``gpus_per_worker = N`` in fleet.toml makes each of its workers
one tensor-parallel engine of N ranks, one GPU each, on one machine.

Its workers run with ``--tensor-parallel-size N`` (locally: infra/fleet/local_actuator.py;
on AWS: the worker_pool module's user data), a local worker gets N GPUs of its own
(infra/fleet/gpus.py), each of the pool's EC2 instance types needs N GPUs
(infra/fleet/instance_gpus.py), and the simulator bills N GPU-hours per worker-hour.
The flag has one source: the pool's own ``worker_args`` may repeat it only with the same N,
and a ``--tensor-parallel-size`` given to ``tide up --fleet`` or ``tide controller`` must
agree with every pool. Torch-free.
"""

from __future__ import annotations

from tide_fleet.infra.fleet.instance_gpus import check_instance_types

TP_FLAG = "--tensor-parallel-size"


def tensor_parallel_argv(gpus_per_worker: int) -> list[str]:
    """The `tide worker` flag of a worker of `gpus_per_worker` GPUs."""
    return [TP_FLAG, str(gpus_per_worker)]


def flag_value(args: list[str], flag: str) -> str | None:
    """The value `args` give `flag` (``--flag V`` or ``--flag=V``; the last one, as argparse
    takes it), or None."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def without_flag(args: list[str], flag: str) -> list[str]:
    """`args` less every ``--flag V`` and ``--flag=V``."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


def check_pool_gpus(
    gpus_per_worker: int, worker_args: list[str], instance_types: list[str]
) -> None:
    """A pool's GPUs per worker against its other fields; ValueError naming the field."""
    given = flag_value(worker_args, TP_FLAG)
    if given is not None and not (given.isdigit() and int(given) == gpus_per_worker):
        raise ValueError(
            f"worker_args: {TP_FLAG} {given} differs from gpus_per_worker ({gpus_per_worker}); "
            f"set gpus_per_worker = {given} instead (it places the worker's GPUs too)"
        )
    try:
        check_instance_types(instance_types, gpus_per_worker)
    except ValueError as e:
        raise ValueError(f"instance_types: {e}") from None


def check_flag_agrees(gpus_by_pool: dict[str, int], tensor_parallel_size: int) -> None:
    """``--tensor-parallel-size`` given with a fleet file: ValueError naming the first pool
    whose gpus_per_worker differs (1, the flag's default, says nothing)."""
    n = tensor_parallel_size
    for pool, gpus in gpus_by_pool.items() if n != 1 else ():
        if gpus != n:
            raise ValueError(
                f"{TP_FLAG} {n}: pool {pool} has gpus_per_worker = {gpus}; with a fleet file, "
                "set each pool's gpus_per_worker there instead"
            )
