"""The engine flags, declared once: the one place that maps them to the engine and to a worker.

Each flag sets one keyword of ``LLMEngine.from_pretrained``: ``dtype`` and ``device`` load
the model, the others are ``EngineConfig`` fields. From the table come the argparse
arguments of ``tide generate``, ``worker``, ``up`` and ``controller``, the keywords for
``from_pretrained``, and the argv with which ``tide up`` and ``tide controller`` pass their
flags on to every ``tide worker`` they start. The defaults repeat those of the engine
(tests/infra/cli/test_engine_flags.py holds them equal), but for the LoRA flags: a served
engine keeps ``--max-loras`` 4 slots (the engine alone: none), and ``--max-lora-rank`` left
unset is the largest rank of the adapters its model declares, at least 16 (``tide worker``
reads them: infra/fleet/fleet_adapters.py). Importing the engine here would load torch for
every ``tide`` command.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tide_fleet.infra.cli.lora_options import lora_rank
from tide_fleet.infra.cli.option_types import SIZE_HELP, byte_size, dtype_help, dtype_option

ENGINE_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EngineFlag:
    dest: str  # the argparse name; the flag is --dest-with-dashes
    kwarg: str  # the from_pretrained keyword it sets
    default: Any = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    help: str | None = None
    metavar: str | None = None
    negates: bool = False  # a switch (--no-...): set means kwarg=False

    @property
    def option(self) -> str:
        return "--" + self.dest.replace("_", "-")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if self.negates:
            parser.add_argument(self.option, action="store_true", help=self.help)
            return
        options: dict[str, Any] = {"default": self.default, "help": self.help}
        if self.type is not None:
            options["type"] = self.type
        if self.choices is not None:
            options["choices"] = self.choices
        if self.metavar is not None:
            options["metavar"] = self.metavar
        parser.add_argument(self.option, **options)

    def value(self, args: argparse.Namespace) -> Any:
        given = getattr(args, self.dest)
        return not given if self.negates else given

    def argv(self, args: argparse.Namespace) -> list[str]:
        given = getattr(args, self.dest)
        if self.negates:
            return [self.option] if given else []
        if self.default is None and not given:  # unset (0 bytes of KV reads as unset too)
            return []
        return [self.option, str(given)]


def rank_count(text: str) -> int:
    """--tensor-parallel-size: a whole number of ranks, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of ranks, 1 or more; got {text!r}"
        )
    return int(text)


ATTENTION_HELP = "auto: Triton on CUDA, the native C++ kernel on CPU"

# fmt: off
ENGINE_FLAGS: tuple[EngineFlag, ...] = (
    # argparse dest, from_pretrained keyword, default, then type/choices and help
    EngineFlag("dtype", "dtype", None, type=dtype_option(*ENGINE_DTYPES), metavar="DTYPE",
               help=f"{dtype_help(*ENGINE_DTYPES)}; default: bfloat16 on a GPU (float16 where "
               "it lacks bf16) and on a CPU with AVX-512 BF16 or AMX; float32 on a CPU without "
               "them"),
    EngineFlag("device", "device", "auto", choices=("auto", "cpu", "cuda")),
    EngineFlag("kv_cache_memory", "kv_cache_memory", None, type=byte_size, metavar="SIZE",
               help=f"KV pool size: {SIZE_HELP}"),
    EngineFlag("gpu_memory_utilization", "gpu_memory_utilization", 0.9, type=float,
               help="CUDA: the share of the GPU's memory this worker may use (weights, "
               "activations and KV cache), like vLLM's"),
    EngineFlag("max_num_seqs", "max_num_seqs", 64, type=int),
    EngineFlag("max_num_batched_tokens", "max_num_batched_tokens", 1024, type=int),
    EngineFlag("attention_backend", "attention_backend", "auto",
               choices=("auto", "torch", "cpp", "triton"), help=ATTENTION_HELP),
    EngineFlag("cuda_graphs", "cuda_graphs", "auto", choices=("auto", "off", "eager"),
               help="decode-only steps as CUDA graphs: auto (on CUDA with Triton), off, or "
               "eager (the same padded steps, uncaptured; for debugging)"),
    EngineFlag("mixed_graph_tokens", "mixed_graph_tokens", 512, type=int, metavar="N",
               help="steps with prefill of up to N tokens also run under --cuda-graphs, "
               "captured in pieces around attention (0: they run eagerly)"),
    EngineFlag("overlap_schedule", "overlap_schedule", "auto", choices=("auto", "on", "off"),
               help="launch each step before the last one's tokens are read back: auto "
               "(on CUDA at one rank), on, or off (the serial loop)"),
    EngineFlag("no_prefix_caching", "enable_prefix_caching", negates=True,
               help="turn the prefix cache off"),
    EngineFlag("batching", "batching", "continuous", choices=("continuous", "static"),
               help="static: admit only into an empty engine, run each batch to completion "
               "(baseline)"),
    EngineFlag("tensor_parallel_size", "tensor_parallel_size", 1, type=rank_count, metavar="N",
               help="shard the model over N ranks, one device each (N divides the model's "
               "KV heads); on CUDA a worker takes N GPUs"),
    EngineFlag("max_loras", "max_loras", 4, type=int, metavar="N",
               help="LoRA adapters one step may run at once (device slots; 0: none served)"),
    EngineFlag("max_cpu_loras", "max_cpu_loras", None, type=int, metavar="N",
               help="LoRA adapters kept in host memory (default: as many as --max-loras)"),
    EngineFlag("max_lora_rank", "max_lora_rank", None, type=lora_rank, metavar="R",
               help="the largest LoRA rank a slot holds, up to 64 (default: the largest "
               "rank of the adapters its model declares, at least 16)"),
)
# fmt: on


def engine_flag(dest: str) -> EngineFlag:
    return next(f for f in ENGINE_FLAGS if f.dest == dest)


# `tide generate` keeps its own order and wording, and runs continuous batching only.
GENERATE_FLAGS: tuple[EngineFlag, ...] = (
    *(engine_flag(d) for d in ("dtype", "device", "kv_cache_memory", "gpu_memory_utilization")),
    engine_flag("max_num_seqs"),
    engine_flag("max_num_batched_tokens"),
    dataclasses.replace(engine_flag("no_prefix_caching"), help=None),
    dataclasses.replace(
        engine_flag("attention_backend"),
        help=ATTENTION_HELP + " (torch reference where it cannot be built)",
    ),
    engine_flag("cuda_graphs"),
    engine_flag("mixed_graph_tokens"),
    engine_flag("overlap_schedule"),
    engine_flag("tensor_parallel_size"),
)


def add_engine_flags(
    parser: argparse.ArgumentParser, flags: Sequence[EngineFlag] = ENGINE_FLAGS
) -> None:
    for flag in flags:
        flag.add_to(parser)


def engine_kwargs(
    args: argparse.Namespace, flags: Sequence[EngineFlag] = ENGINE_FLAGS
) -> dict[str, Any]:
    """The ``LLMEngine.from_pretrained`` keywords the parsed flags ask for."""
    return {flag.kwarg: flag.value(args) for flag in flags}


def worker_argv(args: argparse.Namespace, flags: Sequence[EngineFlag] = ENGINE_FLAGS) -> list[str]:
    """The parsed flags as ``tide worker`` arguments, so each worker runs the same engine."""
    return [arg for flag in flags for arg in flag.argv(args)]
