"""The batched LoRA delta (kernels/lora.py): the rows grouped by slot, the torch path against a
plain per-row loop, and the Triton shrink/expand against the torch path (in Triton's
interpreter on CPU, compiled on a GPU)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tide_fleet.kernels import dispatch
from tide_fleet.kernels.launch import record_launches
from tide_fleet.kernels.lora import add_lora, lora_rows

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
TRITON_DEVICE = "cpu" if INTERPRETED else "cuda"
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None
    or not (INTERPRETED or torch.cuda.is_available()),
    reason="Triton, and a GPU or TRITON_INTERPRET=1",
)  # fmt: skip

QKV = [(0, 32), (32, 48), (48, 64)]  # q | k | v columns of a fused projection
O_PROJ = [(0, 40)]
# Row slots: three adapters, base rows between them; slot 1 is loaded but unused this step.
SLOTS = [2, -1, 0, 2, 2, -1, 3, 0, 2, -1]
TOLERANCE = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.bfloat16: dict(atol=3e-2, rtol=2e-2),
    torch.float16: dict(atol=4e-3, rtol=2e-3),
}


@dataclasses.dataclass
class Case:
    y: torch.Tensor  # [n + padding, out]
    x: torch.Tensor  # [n + padding, in]
    a: torch.Tensor  # [num_slots, n_sub * R, in]
    b: torch.Tensor  # [num_slots, out, R]
    subs: list[tuple[int, int]]


def make_case(subs, rank=12, in_features=80, num_slots=4, rows=13, dtype=torch.float32, seed=0):
    """Random adapters whose own ranks (rank - slot) are zero-padded to R = rank."""
    gen = torch.Generator().manual_seed(seed)
    out = max(hi for _, hi in subs)
    a = torch.randn(num_slots, len(subs) * rank, in_features, generator=gen) * 0.1
    b = torch.randn(num_slots, out, rank, generator=gen) * 0.1
    for slot in range(num_slots):
        own = rank - slot
        b[slot, :, own:] = 0
        for i in range(len(subs)):
            a[slot, i * rank + own : (i + 1) * rank] = 0
    x = torch.randn(rows, in_features, generator=gen)
    y = torch.randn(rows, out, generator=gen)
    return Case(*(t.to(dtype) for t in (y, x, a, b)), subs=list(subs))


def reference(case: Case, slot_ids: list[int]) -> torch.Tensor:
    """y plus each row's delta, row by row and sub-module by sub-module, in float64."""
    y = case.y.double().clone()
    x, a, b = case.x.double(), case.a.double(), case.b.double()
    rank = b.shape[2]
    for r, s in enumerate(slot_ids):
        if s < 0:
            continue
        for i, (lo, hi) in enumerate(case.subs):
            y[r, lo:hi] += (x[r] @ a[s, i * rank : (i + 1) * rank].T) @ b[s, lo:hi].T
    return y


def run(case: Case, slot_ids: list[int], device: str = "cpu") -> torch.Tensor:
    y, x, a, b = (t.to(device) for t in (case.y.clone(), case.x, case.a, case.b))
    rows = lora_rows(slot_ids, device)
    assert rows is not None
    add_lora(y, x, a, b, case.subs, rows)
    return y.cpu()


@pytest.fixture(autouse=True)
def fresh_table(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv(dispatch.FORCE_VAR, raising=False)
    dispatch.refresh()
    yield
    monkeypatch.delenv(dispatch.FORCE_VAR, raising=False)
    dispatch.refresh()


def force(monkeypatch, impl: str) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(dispatch.FORCE_VAR, f"lora={impl}")
    dispatch.refresh()
    assert dispatch.impl("lora", TRITON_DEVICE if impl == "triton" else "cpu") == impl


def test_rows_are_grouped_by_slot_in_one_tensor():
    rows = lora_rows(SLOTS, "cpu")
    assert rows is not None
    assert rows.order.tolist() == [2, 7, 0, 3, 4, 8, 6]
    assert rows.seg_start.tolist() == [0, 2, 6]
    assert rows.seg_len.tolist() == [2, 4, 1]
    assert rows.seg_slot.tolist() == [0, 2, 3]
    segments = [(s, idx.tolist()) for s, idx in rows.segments]
    assert segments == [(0, [2, 7]), (2, [0, 3, 4, 8]), (3, [6])]
    assert (rows.num_rows, rows.max_seg_len, rows.num_lora_rows) == (10, 4, 7)
    storage = rows.order.untyped_storage().data_ptr()
    for t in (rows.seg_start, rows.seg_len, rows.seg_slot, *(idx for _, idx in rows.segments)):
        assert t.untyped_storage().data_ptr() == storage  # views of the one upload
    # 16-byte aligned whatever the row count, so the kernels' specialisation stays put
    assert all(t.data_ptr() % 16 == 0 for t in (rows.seg_start, rows.seg_len, rows.seg_slot))


def test_base_rows_only_make_no_rows():
    assert lora_rows([-1, -1, -1], "cpu") is None
    assert lora_rows([], "cpu") is None
    assert lora_rows(torch.tensor([-1, 1]), "cpu") is not None
    with pytest.raises(ValueError, match=r"-1 .* got -2"):
        lora_rows([0, -2], "cpu")


@pytest.mark.parametrize("subs", [QKV, O_PROJ], ids=["qkv", "o_proj"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_torch_path_matches_the_row_loop(subs, dtype):
    case = make_case(subs, dtype=dtype)
    got = run(case, SLOTS)
    want = reference(case, SLOTS)
    torch.testing.assert_close(got.double(), want, **TOLERANCE[dtype])
    untouched = [r for r, s in enumerate(SLOTS) if s < 0] + list(range(len(SLOTS), 13))
    assert torch.equal(got[untouched], case.y[untouched])  # base rows and padding rows


def test_shapes_that_do_not_fit_are_refused():
    case = make_case(QKV)
    rows = lora_rows(SLOTS, "cpu")
    assert rows is not None
    with pytest.raises(ValueError, match="rank blocks"):
        add_lora(case.y, case.x, case.a, case.b, O_PROJ, rows)
    with pytest.raises(ValueError, match="overlap"):
        add_lora(case.y, case.x, case.a, case.b, [(0, 32), (16, 48), (48, 64)], rows)
    one_row = lora_rows([5], "cpu")
    assert one_row is not None
    with pytest.raises(ValueError, match="slot 5 of 4"):
        add_lora(case.y, case.x, case.a, case.b, QKV, one_row)
    with pytest.raises(ValueError, match="at least 10 rows"):
        add_lora(case.y[:8], case.x[:8], case.a, case.b, QKV, rows)


@settings(max_examples=40, deadline=None)
@given(slot_ids=st.lists(st.integers(-1, 3), min_size=1, max_size=24), padding=st.integers(0, 3))
def test_any_slot_pattern_matches_the_row_loop(slot_ids, padding):
    case = make_case(QKV, rank=4, in_features=16, rows=len(slot_ids) + padding)
    rows = lora_rows(slot_ids, "cpu")
    if rows is None:
        assert all(s == -1 for s in slot_ids)
        return
    got = case.y.clone()
    add_lora(got, case.x, case.a, case.b, case.subs, rows)
    torch.testing.assert_close(got.double(), reference(case, slot_ids), atol=1e-5, rtol=1e-5)
    assert torch.equal(got[len(slot_ids) :], case.y[len(slot_ids) :])


@needs_triton
@pytest.mark.parametrize(
    ("subs", "rank", "dtype", "slot_ids"),
    [
        (QKV, 12, torch.float32, SLOTS),
        (QKV, 16, torch.bfloat16, SLOTS),
        (O_PROJ, 12, torch.float16, SLOTS),
        (O_PROJ, 16, torch.float32, [1] * 70 + [-1, 0, 0]),  # a segment over two 64-row tiles
        ([(0, 8), (8, 24), (24, 40), (40, 72)], 8, torch.float32, SLOTS),  # two expand launches
    ],
    ids=["qkv-fp32", "qkv-bf16", "o-fp16", "long-segment", "four-subs"],
)
def test_triton_matches_the_torch_path(monkeypatch, subs, rank, dtype, slot_ids):
    case = make_case(subs, rank=rank, rows=len(slot_ids) + 3, dtype=dtype)
    force(monkeypatch, "torch")
    want = run(case, slot_ids)
    force(monkeypatch, "triton")
    got = run(case, slot_ids, TRITON_DEVICE)
    torch.testing.assert_close(got.double(), want.double(), **TOLERANCE[dtype])
    untouched = [r for r, s in enumerate(slot_ids) if s < 0] + [len(slot_ids) + i for i in range(3)]
    assert torch.equal(got[untouched], case.y[untouched])


@needs_triton
def test_a_new_slot_pattern_compiles_nothing_new(monkeypatch):
    force(monkeypatch, "triton")
    case = make_case(QKV)
    keys = []
    for slot_ids in ([0], [2, -1, 1, 2, 3], SLOTS, [3, 3, 3, -1, 1, 0, 0]):
        with record_launches() as record:
            run(case, slot_ids, TRITON_DEVICE)
        keys.append(record)
    assert all(k == keys[0] for k in keys), keys


needs_native = pytest.mark.skipif(
    "cpp" not in dispatch.accepted("lora", dispatch.hardware_class(torch.device("cpu"))),
    reason="no native CPU kernels here",
)


@needs_native
@pytest.mark.parametrize(
    ("subs", "in_features"),
    [(QKV, 80), (QKV, 64), (O_PROJ, 64), ([(0, 48), (48, 96)], 96)],
    ids=["qkv-odd-in", "qkv-lanes", "o-odd-width", "gate-up-lanes"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("slot_ids", [SLOTS, [i % 3 for i in range(11)]], ids=["mixed", "full"])
def test_the_native_kernel_matches_the_row_loop(monkeypatch, subs, in_features, dtype, slot_ids):
    """b stored rank-major ([slots, R, out], the engine's layout) takes the native kernel:
    blocks of up to four rows per adapter, the AVX-512 BF16 lanes where shapes allow."""
    force(monkeypatch, "cpp")
    case = make_case(subs, in_features=in_features, dtype=dtype, rows=len(slot_ids) + 2)
    case.b = case.b.transpose(1, 2).contiguous().transpose(1, 2)  # rank-major storage
    assert case.b.stride(1) == 1
    got = run(case, slot_ids)
    torch.testing.assert_close(got.double(), reference(case, slot_ids), **TOLERANCE[dtype])
    untouched = [r for r, s in enumerate(slot_ids) if s < 0] + [len(slot_ids), len(slot_ids) + 1]
    assert torch.equal(got[untouched], case.y[untouched])


def test_sub_modules_with_gaps_between_them_take_their_own_columns(monkeypatch):
    """Columns between sub-modules (an adapter on q and v, none on k) are left alone."""
    force(monkeypatch, "torch")
    case = make_case([(0, 16), (40, 64)], rows=len(SLOTS))
    got = run(case, SLOTS)
    torch.testing.assert_close(got.double(), reference(case, SLOTS), **TOLERANCE[torch.float32])
    assert torch.equal(got[:, 16:40], case.y[:, 16:40])
