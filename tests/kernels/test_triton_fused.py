"""The fused elementwise Triton kernels (kernels/triton_fused.py, kernels/triton_rope.py)
against torch references that round as the native CPU kernels do (csrc/elementwise), in
Triton's interpreter on CPU (compiled on a GPU), and against the native CPU ops themselves
where they are built. Through ``Elementwise`` and a model: test_triton_fused_elementwise.py.

float32 is held close (1e-6). bf16/fp16 RoPE is held bit-exact: both sides compute the same
float32 products and difference, then round once. The norm and SiLU × up are held to at most
one ulp, and almost all elements exact: the norm's sum of squares is added in another order
(a tree in Triton, torch's vectorised sum, the C++ lanes), so inv_rms can differ in its last
bit and flip a rounding; SiLU's e^x is another implementation on each side (numpy's or the
GPU's, torch's, the C++ polynomial). A truncating bf16 cast would be off by one ulp in about
half the elements: the "almost all exact" check catches it.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels.launch import record_launches

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or not (INTERPRETED or torch.cuda.is_available()),
    reason="Triton, and a GPU or TRITON_INTERPRET=1",
)
pytestmark = needs_triton
ROWS = [1, 3, 17]
LOW = [torch.bfloat16, torch.float16]
EPS = 1e-5


def fused():  # type: ignore[no-untyped-def]
    from tide_fleet.kernels import triton_fused

    return triton_fused


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


def strided(rows: int, cols: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """[rows, cols], a view of a [rows, cols + 24] buffer: rows not contiguous."""
    return randn(rows, cols + 24, dtype=dtype, seed=seed)[:, 5 : 5 + cols]


def same(got: torch.Tensor, want: torch.Tensor, exact: bool = False) -> None:
    """float32: close to 1e-6; bf16/fp16: at most one ulp apart and 99% bit-exact, or all
    bit-exact where ``exact``."""
    assert got.dtype == want.dtype and got.shape == want.shape
    got, want = got.cpu(), want.cpu()
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        return
    bits = [t.view(torch.int16).int() for t in (got, want)]
    ordered = [torch.where(b < 0, -(b & 0x7FFF), b) for b in bits]  # ±0 alike
    ulps = (ordered[0] - ordered[1]).abs()
    off = int((ulps > 0).sum())
    if exact:
        assert off == 0, f"{off} of {ulps.numel()} elements differ"
    assert int(ulps.max()) <= 1, f"{int(ulps.max())} ulps apart"
    assert off <= ulps.numel() // 100, f"{off} of {ulps.numel()} elements one ulp apart"


# ---------------------------------------------------------------- torch references


def round_as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).float()


def ref_norm(h: torch.Tensor, d: torch.Tensor | None, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(out, hidden after the add): h + d rounded, ss in float32 over it, one rounding
    before the weight multiply and one after."""
    dtype, hf = h.dtype, h.float()
    if d is not None:
        hf = round_as(hf + d.float(), dtype)
    inv = 1.0 / torch.sqrt((hf * hf).sum(-1, keepdim=True) / h.shape[1] + EPS)
    return (w.float() * round_as(hf * inv, dtype)).to(dtype), hf.to(dtype)


def ref_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    g, u = gate_up.float().chunk(2, dim=-1)
    act = round_as(g / (1.0 + torch.exp(-g)), gate_up.dtype)
    return (act * u).to(gate_up.dtype)


def ref_rotary(x: torch.Tensor, positions: torch.Tensor, cos, sin, heads: int, hd: int):  # type: ignore[no-untyped-def]
    """x with its first ``heads`` heads rotated: float products, one rounding each."""
    out = x.clone()
    part = x[:, : heads * hd].float().view(x.shape[0], heads, hd)
    c, s = (t[positions].float().unsqueeze(1) for t in (cos, sin))
    a, b = part[..., : hd // 2], part[..., hd // 2 :]
    lo = a * c[..., : hd // 2] - b * s[..., : hd // 2]
    hi = b * c[..., hd // 2 :] + a * s[..., hd // 2 :]
    out[:, : heads * hd] = torch.cat((lo, hi), -1).to(x.dtype).view(x.shape[0], -1)
    return out


def tables(max_pos: int, hd: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
    freqs = torch.arange(max_pos).float()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos().to(dtype).to(DEVICE), emb.sin().to(dtype).to(DEVICE)


def positions_for(rows: int, max_pos: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, max_pos, (rows,), generator=gen).to(DEVICE)


# ---------------------------------------------------------------- kernels against references


@pytest.mark.parametrize("dtype", [torch.float32, *LOW])
@pytest.mark.parametrize("rows", ROWS)
def test_rms_norm(dtype, rows):
    dim = 1000  # not a power of two: a masked tail
    x, w = strided(rows, dim, dtype), randn(dim, dtype=dtype, seed=1)
    same(fused().rms_norm(x, w, EPS), ref_norm(x, None, w)[0])


@pytest.mark.parametrize("dtype", [torch.float32, *LOW])
@pytest.mark.parametrize("rows", ROWS)
def test_add_rms_norm_writes_the_rounded_sum_back(dtype, rows):
    dim = 2048
    hidden, delta = strided(rows, dim, dtype), strided(rows, dim, dtype, seed=2)
    w = randn(dim, dtype=dtype, seed=1)
    want_out, want_hidden = ref_norm(hidden, delta, w)
    out = fused().add_rms_norm_(hidden, delta, w, EPS)
    same(hidden, want_hidden, exact=True)  # one float add, one rounding: exact
    same(out, want_out)


@pytest.mark.parametrize("dtype", [torch.float32, *LOW])
@pytest.mark.parametrize("rows", ROWS)
def test_silu_mul(dtype, rows):
    inter = 1500  # two column programs, the second masked
    gate_up = randn(rows, 2 * inter, dtype=dtype) * 3
    same(fused().silu_mul(gate_up), ref_silu_mul(gate_up))


@pytest.mark.parametrize("dtype", [torch.float32, *LOW])
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("rows", ROWS)
def test_rotary_rotates_the_first_heads_in_place(dtype, hd, rows):
    heads, width = 10, 12 * hd  # q and k heads rotated; v's two heads left alone
    x = strided(rows, width, dtype)
    cos, sin = tables(300, hd, dtype)
    positions = positions_for(rows, 300)
    want = ref_rotary(x, positions, cos, sin, heads, hd)
    fused().rotary_(x, positions, cos, sin, heads, hd)
    same(x, want, exact=True)


def kv_case(rows: int, hd: int, dtype: torch.dtype, slots: list[int]):  # type: ignore[no-untyped-def]
    """qkv rows for 8 q heads and 2 KV heads, caches of 6 blocks x 16 filled with 7s."""
    qkv = strided(rows, 12 * hd, dtype, seed=rows)
    k_cache = torch.full((2, 6, 16, hd), 7.0, dtype=dtype, device=DEVICE)
    cos, sin = tables(300, hd, dtype)
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
    return (
        qkv,
        positions_for(rows, 300, seed=rows),
        cos,
        sin,
        k_cache,
        k_cache.clone(),
        slot_mapping,
    )


@pytest.mark.parametrize("dtype", [torch.float32, *LOW])
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("rows", ROWS)
def test_rotary_kv_write_rotates_and_writes_the_slots(dtype, hd, rows):
    # A padding row (-1) among the tokens, and a padded tail of rows past the slot mapping.
    slots = [(7 * r + 3) % 96 for r in range(rows)]
    slots[rows // 2] = -1
    slots = slots[: max(1, rows - 2)]
    qkv, positions, cos, sin, k_cache, v_cache, slot_mapping = kv_case(rows, hd, dtype, slots)
    original = qkv.clone()
    fused().rotary_kv_write_(qkv, positions, cos, sin, 8, 2, hd, k_cache, v_cache, slot_mapping)
    want = ref_rotary(original, positions, cos, sin, 10, hd)
    same(qkv, want, exact=True)  # padding rows rotated too, v untouched
    want_k = torch.full_like(k_cache, 7.0)
    want_v = want_k.clone()
    for row, slot in enumerate(slots):
        if slot < 0:
            continue
        token = want[row].view(12, hd)
        want_k.view(2, -1, hd)[:, slot] = token[8:10]
        want_v.view(2, -1, hd)[:, slot] = token[10:12]
    same(k_cache, want_k, exact=True)
    same(v_cache, want_v, exact=True)


def test_rotary_kv_write_with_every_row_padding_writes_nothing():
    qkv, positions, cos, sin, k_cache, v_cache, slot_mapping = kv_case(3, 64, torch.bfloat16,
                                                                       [-1, -1, -1])  # fmt: skip
    fused().rotary_kv_write_(qkv, positions, cos, sin, 8, 2, 64, k_cache, v_cache, slot_mapping)
    assert bool((k_cache == 7).all()) and bool((v_cache == 7).all())


def test_no_compile_variant_depends_on_the_row_count():
    keys_per_rows = []
    for rows in ROWS:
        slots = list(range(rows))
        qkv, positions, cos, sin, k_cache, v_cache, slot_mapping = kv_case(rows, 64, torch.bfloat16,
                                                                           slots)  # fmt: skip
        x, w = randn(rows, 256, dtype=torch.bfloat16), randn(256, dtype=torch.bfloat16)
        with record_launches() as keys:
            fused().rms_norm(x, w, EPS)
            fused().add_rms_norm_(x, x.clone(), w, EPS)
            fused().silu_mul(randn(rows, 512, dtype=torch.bfloat16))
            fused().rotary_(qkv, positions, cos, sin, 10, 64)
            fused().rotary_kv_write_(qkv, positions, cos, sin, 8, 2, 64, k_cache, v_cache,
                                     slot_mapping[: max(1, rows - 1)])  # fmt: skip
        keys_per_rows.append(keys)
    assert len(keys_per_rows[0]) == 5
    assert keys_per_rows[0] == keys_per_rows[1] == keys_per_rows[2]


def test_calls_the_kernels_do_not_take_are_refused_by_name():
    f = fused()
    wide = randn(2, f.MAX_NORM_DIM + 8)
    assert not f.takes_norm(wide, randn(f.MAX_NORM_DIM + 8))
    with pytest.raises(ValueError, match="rms_norm"):
        f.rms_norm(wide, randn(f.MAX_NORM_DIM + 8), EPS)
    x = randn(3, 128)
    cos, sin = tables(16, 64, torch.bfloat16)  # tables of another dtype
    assert not f.takes_rotary(x, positions_for(3, 16), cos, sin, 2, 64)
    with pytest.raises(ValueError, match="rotary_"):
        f.rotary_(x, positions_for(3, 16), cos, sin, 2, 64)


# ---------------------------------------------------------------- against the native CPU ops


@pytest.mark.skipif(not INTERPRETED, reason="the native ops run on CPU tensors")
def test_the_triton_and_native_cpu_ops_agree_in_bf16():
    ops = cpu_kernels.ops()
    if ops is None:
        pytest.skip("native CPU kernels could not be built here (see the log)")
    bf16, rows, dim, hd = torch.bfloat16, 17, 1024, 64
    x, w = strided(rows, dim, bf16), randn(dim, dtype=bf16, seed=1)
    same(fused().rms_norm(x, w, EPS), ops.rms_norm(x, w, EPS))
    delta = strided(rows, dim, bf16, seed=2)
    h_triton, h_native = x.clone(), x.clone()
    out = fused().add_rms_norm_(h_triton, delta, w, EPS)
    same(out, ops.add_rms_norm_(h_native, delta, w, EPS))
    same(h_triton, h_native, exact=True)
    gate_up = randn(rows, 2 * 1000, dtype=bf16) * 3
    same(fused().silu_mul(gate_up), ops.silu_mul(gate_up))
    qkv = strided(rows, 12 * hd, bf16)
    cos, sin = tables(300, hd, bf16)
    positions = positions_for(rows, 300)
    native = qkv.clone()
    fused().rotary_(qkv, positions, cos, sin, 10, hd)
    ops.rotary_(native, positions, cos, sin, 10, hd)
    same(qkv, native, exact=True)
