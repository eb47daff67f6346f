"""Serving longer contexts must not compile the decode kernels again.

Triton compiles one variant per distinct specialisation key (constexprs, dtypes,
alignment, and int arguments' ==1 / %16 unless ``do_not_specialize``). In the interpreter
nothing compiles, so the test counts the keys ``tide_fleet.kernels.launch`` records per launch.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.kernels.test_attention import dense_reference
from tide_fleet.kernels import triton_attention as tk
from tide_fleet.kernels import triton_decode as td
from tide_fleet.kernels.launch import DeviceMismatch, launch, record_launches, specialisation_key

CONTEXTS = [100, 500, 513, 1000, 1024, 2047, 3000, 4097, 6000, 8000, 8192]


def _decode_at(context: int, block_size: int = 16, kvh: int = 1, heads: int = 2, hd: int = 16):
    gen = torch.Generator().manual_seed(context)
    width = -(-context // block_size)  # the runner's table width grows with the context
    k_cache = torch.randn(kvh, width, block_size, hd, generator=gen)
    v_cache = torch.randn(kvh, width, block_size, hd, generator=gen)
    tables = torch.randperm(width, generator=gen).view(1, width)
    query = torch.randn(1, heads, hd, generator=gen)
    lens = torch.tensor([context], dtype=torch.int32)
    out = td.decode_attention(query, k_cache, v_cache, tables, lens, hd**-0.5, context)
    return out, (query, k_cache, v_cache, tables)


def test_decode_compiles_one_variant_for_contexts_100_to_8k():
    with record_launches() as keys:
        for context in CONTEXTS:
            _decode_at(context)
    per_kernel: dict[str, int] = {}
    for key in keys:
        per_kernel[key[0]] = per_kernel.get(key[0], 0) + 1
    assert per_kernel == {"decode_attention": 1, "decode_reduce": 1}


@pytest.mark.parametrize("context", [700, 9000])  # split context; past MAX_PARTITIONS x 512
def test_decode_with_scaled_partitions_matches_dense(context):
    out, (query, k_cache, v_cache, tables) = _decode_at(context)
    kvh, _, _, hd = k_cache.shape
    k = k_cache[:, tables[0]].reshape(kvh, -1, hd)[:, :context].transpose(0, 1)
    v = v_cache[:, tables[0]].reshape(kvh, -1, hd)[:, :context].transpose(0, 1)
    q = torch.zeros(context, query.shape[1], hd)
    q[-1] = query[0]
    ref = dense_reference(q, k, v, hd**-0.5)[-1]
    torch.testing.assert_close(out[0], ref, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("block_size", [16, 32, 1024])
def test_partitions_are_bounded_and_block_aligned(block_size):
    for context in [*CONTEXTS, 1, 32_768, 131_072, 1_000_000]:
        partition, parts = td.decode_partitions(context, block_size)
        assert 1 <= parts <= td.MAX_PARTITIONS
        assert partition % block_size == 0 and partition % td.PARTITION_SIZE == 0
        assert partition * parts >= context > partition * (parts - 1)


def test_the_key_sees_a_specialised_int_and_ignores_an_unspecialised_one():
    def key(n: int, unspecialised: tuple[str, ...]) -> tuple:
        return specialisation_key("k", {"n": n}, {"B": 4}, unspecialised)

    assert key(32, ()) != key(33, ())  # 32 divides by 16: its own variant
    assert key(32, ("n",)) == key(33, ("n",))
    assert key(4, ()) != specialisation_key("k", {"n": 4}, {"B": 8})


def test_a_launch_refuses_a_tensor_on_another_device(monkeypatch):
    from tide_fleet.kernels import launch as launch_module

    monkeypatch.setattr(launch_module, "CHECK_DEVICES", True)  # on under the interpreter

    def never_called(*args, **kwargs):
        raise AssertionError("launched")

    class Kernel:
        def __getitem__(self, grid):
            return never_called

    q = torch.zeros(4)
    elsewhere = torch.empty(4, device="meta")
    with pytest.raises(DeviceMismatch, match="tables is on meta but query is on cpu"):
        launch(Kernel(), (1,), "op", {"query": q, "tables": elsewhere, "n": 4}, {})


def test_the_triton_wrappers_check_every_tensor(monkeypatch):
    from tide_fleet.kernels import launch as launch_module

    monkeypatch.setattr(launch_module, "CHECK_DEVICES", True)
    q = torch.zeros(1, 2, 16)
    cache = torch.zeros(1, 2, 16, 16)
    table = torch.zeros(1, 2, dtype=torch.long, device="meta")
    lens = torch.ones(1, dtype=torch.int32)
    with pytest.raises(DeviceMismatch, match="block_tables is on meta"):
        td.decode_attention(q, cache, cache, table, lens, 0.25, 1)
    with pytest.raises(DeviceMismatch, match="block_table is on meta"):
        tk.prefill_attention(q, cache, cache, table[0], 0, 0.25)
    with pytest.raises(DeviceMismatch, match="slots is on meta"):
        tk.write_kv_cache(q[:, :1], q[:, :1], cache, cache, table[0, :1])
