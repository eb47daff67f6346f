"""Native CPU kernels (every file under kernels/csrc), built on first use.

``ops()`` builds the C++ files once, as one extension, with ``-O3 -march=native`` through
``torch.utils.cpp_extension`` and returns ``torch.ops.tide``, or ``None`` where the
build is impossible (no compiler, ``TIDE_CPU_KERNELS=0``, or an engine-only install where
``infra.settings`` does not import, so there is no setting to read) or another process held
the build for longer than ``BUILD_WAIT_S``; the engine then keeps the torch reference path,
and says so once in the log.

Builds live under ``$TIDE_KERNEL_CACHE`` (default ``~/.cache/tide/kernels``), one folder
per ``build_key``: everything the build reads or its ``build.ninja`` names (source text,
torch version and install path, Python headers, compiler, flags, this CPU). The source
is copied into that folder and built from there, so checkouts sharing a venv share one
build instead of rebuilding each other's; each venv or CPU gets a folder of its own.
A build or load holds ``LOCK_NAME`` in its folder (``tide_fleet.kernels.build_lock``), a lock the
OS drops when its holder dies, so a killed build never blocks the next one.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import platform
import shutil
import sysconfig
from pathlib import Path
from typing import Any

import torch

from tide_fleet.kernels import build_lock

try:
    from tide_fleet.infra.settings import get_settings
except ImportError:  # an engine-only install (scripts/gpu_check.py): no pydantic-settings
    HAS_SETTINGS = False
else:
    HAS_SETTINGS = True

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
# One extension from every file under csrc, grouped by op (gemv/, gemm/, attention/,
# elementwise/, step/; common/ for what several share), ISA variants named as such.
SOURCES = tuple(sorted(CSRC.rglob("*.cpp")))
HEADERS = tuple(sorted(CSRC.rglob("*.h")))
CFLAGS = ("-O3", "-march=native", "-fopenmp")
LDFLAGS = ("-fopenmp",)
LOCK_NAME = "tide-build.lock"
# A build takes ~30 s on two busy cores; past this a waiter serves with the torch path
# rather than not at all.
BUILD_WAIT_S = 120.0
CPU_FIELDS = {"model name", "flags", "Features", "CPU implementer", "CPU part"}
NO_SETTINGS = (
    "Tide's settings (tide_fleet.infra.settings: pydantic-settings) cannot be imported here"
)


def cache_root() -> Path:
    if not HAS_SETTINGS:
        raise RuntimeError(f"the kernel cache folder is a Tide setting; {NO_SETTINGS}")
    return get_settings().kernel_cache


def build_key(source: bytes) -> str:
    """A hash of every input of the build; equal keys mean one build serves both."""
    from torch.utils import cpp_extension

    compiler = cpp_extension.get_cxx_compiler()
    inputs = [
        torch.__version__,
        str(Path(torch.__file__).parent),  # build.ninja names torch's headers and libraries
        sysconfig.get_paths()["include"],  # ... and Python's headers
        shutil.which(compiler) or compiler,
        " ".join(CFLAGS),
        " ".join(LDFLAGS),
        _cpu_identity(),
    ]
    digest = hashlib.sha256(source)
    for item in inputs:
        digest.update(b"\0" + item.encode())
    return digest.hexdigest()[:16]


def build_dir() -> Path:
    return cache_root() / f"cpu-{build_key(_source_bytes())}"


def _source_bytes() -> bytes:
    return b"\0".join(
        src.relative_to(CSRC).as_posix().encode() + b"\0" + src.read_bytes()
        for src in SOURCES + HEADERS
    )


def load(directory: Path, wait_s: float = BUILD_WAIT_S) -> Any | None:
    """Build (if needed) and load the kernels in ``directory``: torch.ops.tide, or None."""
    try:
        with build_lock.held(directory / LOCK_NAME, wait_s):
            # Only holders of our lock build here: torch's own lock file, if there is
            # one, was left by a build that was killed, and would make torch wait forever.
            (directory / "lock").unlink(missing_ok=True)
            for header in HEADERS:  # the tree the sources #include "op/file.h" from
                _staged_source(header, directory)
            _build_and_load([_staged_source(src, directory) for src in SOURCES], directory)
    except Exception as exc:  # any build failure, or a wait past wait_s: use the torch path
        log.warning("native CPU kernels unavailable (%s); using the torch reference path", exc)
        return None
    return torch.ops.tide


@functools.cache
def ops() -> Any:
    """torch.ops.tide with the native kernels loaded, or None (see the module doc)."""
    if not HAS_SETTINGS:
        log.info("native CPU kernels off: %s; using the torch reference path", NO_SETTINGS)
        return None
    if not get_settings().cpu_kernels:
        log.info("native CPU kernels disabled by TIDE_CPU_KERNELS=0")
        return None
    return load(build_dir())


def gemv_max_rows() -> int:
    """Largest row count the native bf16 GEMV takes (0: not on this CPU or not built)."""
    native = ops()
    return int(native.gemv_max_rows()) if native is not None else 0


def gemv_step_rows() -> int:
    """Rows a step gives the native GEMV: 40 on AMX (the GEMM is faster past them), else
    gemv_max_rows()."""
    native = ops()
    return int(native.gemv_step_rows()) if native is not None else 0


@functools.cache
def isa() -> str:
    """What the native kernels' fastest paths run on here: "amx", "avx512bf16", "avx512"
    (no bf16 dot product), "avx2", "generic" (portable loops), or "" (no native kernels).
    kernels/dispatch.py names this CPU's hardware class after it."""
    native = ops()
    if native is None:
        return ""
    if native.gemm_rows_ready():
        return "amx"
    if native.gemv_max_rows() > 0:
        return "avx512bf16"
    vector = str(native.decode_attention_isa())
    return vector if vector in ("avx512", "avx2") else "generic"


def gemm_f32_preferred() -> bool:
    """float32 projections can take the native AVX2 GEMM (csrc/gemm/gemm_f32_avx2.cpp): the
    build has AVX2 + FMA and the CPU no AVX-512, where oneDNN's own kernels are wider."""
    native = ops()
    return native is not None and bool(native.gemm_f32_preferred())


def gemm_rows_ready() -> bool:
    """The native bf16 GEMM (csrc/gemm/gemm_amx.cpp) runs here: AMX tiles granted."""
    native = ops()
    return native is not None and bool(native.gemm_rows_ready())


@functools.cache
def native_prefill() -> bool:
    """The native bf16 prefill attention kernel runs here (csrc/attention/prefill.cpp): on
    AMX tiles (the OS granted this process the tile state) or AVX-512 BF16."""
    native = ops()
    return native is not None and bool(native.prefill_attention_supported())


def attention_pass_isa() -> str:
    """What the native bf16 attention multiplies on: "amx", "avx512_bf16", or "" (none)."""
    native = ops()
    return str(native.attention_pass_isa()) if native is not None else ""


def main() -> int:
    """Build now and say what is available (``make kernels``, before tests and workers)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    native = ops()
    where = f"ready in {build_dir()}" if native is not None else "not available"
    print(
        f"native CPU kernels: {where}; this CPU's class: cpu-{isa() or 'no-native'} "
        f"(python -m tide_fleet.kernels: the kernel serving each op)"
    )
    return 0


def _build_and_load(sources: list[Path], directory: Path) -> None:
    from torch.utils import cpp_extension

    cpp_extension.load(
        name="tide_cpu_kernels",
        sources=[str(src) for src in sources],
        extra_cflags=list(CFLAGS),
        extra_ldflags=list(LDFLAGS),
        extra_include_paths=[str(directory / "csrc")],
        build_directory=str(directory),
        is_python_module=False,
        verbose=False,
    )


def _staged_source(source: Path, directory: Path) -> Path:
    # Rewritten only when it differs: a fresh mtime alone would make ninja rebuild.
    text = source.read_bytes()
    staged = directory / "csrc" / source.relative_to(CSRC)
    staged.parent.mkdir(parents=True, exist_ok=True)
    if not staged.is_file() or staged.read_bytes() != text:
        partial = staged.with_name(staged.name + ".partial")
        partial.write_bytes(text)
        partial.replace(staged)
    return staged


def _cpu_identity() -> str:
    # -march=native compiles for this CPU only: a cache shared by hosts (an NFS home)
    # must not hand one host's build to another with other instructions.
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    fields = [line for line in first.splitlines() if line.split(":")[0].strip() in CPU_FIELDS]
    return "\n".join([platform.machine(), *sorted(fields)])
