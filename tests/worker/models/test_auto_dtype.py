"""`--dtype` left out (or auto): bfloat16 only where the hardware computes in it.

Found on an AVX2-only AMD EPYC: bfloat16 was the default everywhere, and there oneDNN
has no bf16 instructions to use, so a 512-row projection ran at 11.5 GFLOP/s in bf16
against 67 in float32 (and 0.6 against 20 for one row). An operator who ran `make up`
there got a fleet several times slower than it had to be.
"""

from __future__ import annotations

import pytest
import torch

from tide_fleet.worker.models import loader
from tide_fleet.worker.models.loader import resolve_dtype

CPU = torch.device("cpu")


def cpu_with(monkeypatch: pytest.MonkeyPatch, bf16: bool, amx: bool) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)


@pytest.mark.parametrize("bf16,amx", [(True, False), (False, True), (True, True)])
def test_auto_is_bfloat16_on_a_cpu_with_bf16_instructions(monkeypatch, bf16, amx):
    cpu_with(monkeypatch, bf16, amx)
    assert resolve_dtype(None, None, CPU) == torch.bfloat16
    assert resolve_dtype("auto", None, CPU) == torch.bfloat16


def test_auto_is_float32_on_a_cpu_without_them(monkeypatch):
    cpu_with(monkeypatch, False, False)
    assert resolve_dtype(None, None, CPU) == torch.float32
    assert resolve_dtype("auto", None, CPU) == torch.float32


def test_an_explicit_dtype_wins_whatever_the_cpu(monkeypatch):
    cpu_with(monkeypatch, False, False)
    assert resolve_dtype("bfloat16", None, CPU) == torch.bfloat16
    cpu_with(monkeypatch, True, True)
    assert resolve_dtype("float32", None, CPU) == torch.float32
    with pytest.raises(loader.ModelLoadError, match="unknown dtype 'int4'"):
        resolve_dtype("int4", None, CPU)


@pytest.mark.parametrize("bf16,expected", [(True, torch.bfloat16), (False, torch.float16)])
def test_auto_on_cuda_is_bfloat16_where_the_gpu_has_it_else_float16(monkeypatch, bf16, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    assert resolve_dtype(None, None, torch.device("cuda")) == expected
