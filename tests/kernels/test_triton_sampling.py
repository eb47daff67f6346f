"""The one-launch sampling kernel (kernels/triton_sampling.py) against the torch path
(kernels/sampling.py), token for token and ``bad`` for ``bad``, in Triton's interpreter on
CPU (compiled on a GPU); the torch path against a plain Python reference of the semantics
(a sorted list per row); and the sampler and a small engine with the op forced to triton.

Vocabularies are small and odd (50-3000) and chunks narrow, so rows cross chunk edges.
Exact boundaries (u x total or p x mass within a few ulps of a CDF step) are avoided except
where built from exactly representable values: the two paths add float64 in other orders.
"""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import make_engine
from tide_fleet.infra.contract.sampling_params import SamplingParams
from tide_fleet.kernels import dispatch, sampling
from tide_fleet.kernels.launch import record_launches
from tide_fleet.worker.engine.request import Request
from tide_fleet.worker.engine.sampler import NoTokenToSample, Sampler

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or not (INTERPRETED or torch.cuda.is_available()),
    reason="Triton, and a GPU or TRITON_INTERPRET=1",
)
pytestmark = [needs_triton, pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # NaN rows
NAN, INF = float("nan"), float("inf")
LAST_U = 1.0 - 2.0**-53  # the largest row_uniform


def torch_sample(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
    u: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The torch path over every row at once, with per-row tensors as the kernel takes them
    (temperature 0: greedy): the reference the kernel is held to."""
    t = temperature.float()
    is_random = t > 0
    scaled = logits.float() / torch.where(is_random, t, 1.0).unsqueeze(1)
    picked, failed = sampling.sample_rows(scaled, u.double(), top_k.long(), top_p.float())
    tokens, bad = sampling.greedy(logits.float())
    return torch.where(is_random, picked, tokens), torch.where(is_random, failed, bad)


def kernel():  # type: ignore[no-untyped-def]
    from tide_fleet.kernels import triton_sampling

    return triton_sampling


def rows(
    logits: torch.Tensor, opts: list[tuple[float, int, float, float]], block: int | None = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel and torch path on the same rows (temperature, top_k, top_p, u): equal ``bad``,
    equal tokens where not bad, every token in range. Returns the tokens and bad."""
    t, k, p, u = (torch.tensor(c) for c in zip(*opts, strict=True))
    t, k, p, u = t.float(), k.long(), p.float(), u.double()
    want, want_bad = torch_sample(logits, t, k, p, u)
    args = (logits.to(DEVICE), t.to(DEVICE), k.to(DEVICE), p.to(DEVICE), u.to(DEVICE))
    got, got_bad = (x.cpu() for x in kernel().sample(*args, block=block))
    assert got.dtype == torch.long and got_bad.dtype == torch.bool
    assert bool(((got >= 0) & (got < logits.shape[1])).all())
    assert got_bad.tolist() == want_bad.tolist()
    assert torch.where(got_bad, -1, got).tolist() == torch.where(want_bad, -1, want).tolist()
    return got, got_bad


def randn(n: int, vocab: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def uniforms(n: int, seed: int = 1) -> list[float]:
    return [sampling.row_uniform(seed, i) for i in range(n)]


# ---------------------------------------------------------------- kernel == torch path


def test_greedy_rows_take_the_first_maximum():
    x = randn(4, 200)
    x[0, 10] = x[0, 150] = 50.0  # tied across chunks: the first
    x[1, 64] = x[1, 65] = 50.0  # tied at a chunk edge
    x[2, 199] = 50.0  # in the last, partial chunk
    x[3] = 0.0
    x[3, 7] = -0.0  # -0 and +0 are equal: index 0 is the first maximum
    got, bad = rows(x, [(0.0, 0, 1.0, 0.0)] * 4)
    assert got.tolist() == [10, 64, 199, 0] and not bad.any()


@pytest.mark.parametrize("vocab", [50, 97, 1000, 3000])
@pytest.mark.parametrize("block", [32, None])
def test_temperature_rows_draw_in_vocabulary_order(vocab, block):
    u = [0.0, 1e-12, 0.25, 0.5, 0.999999, LAST_U]
    opts = [(t, -1, 1.0, ui) for t, ui in zip([1.0, 0.7, 1.3, 2.0, 0.5, 1.0], u, strict=True)]
    rows(randn(6, vocab, seed=vocab), opts, block)


@pytest.mark.parametrize(
    ("top_k", "top_p"),
    [(5, 1.0), (1, 1.0), (40, 1.0), (-1, 0.9), (-1, 0.3), (-1, 1e-6), (20, 0.8), (1, 0.5),
     (7, 1e-9), (99, 0.97)],
)  # fmt: skip
@pytest.mark.parametrize("vocab", [100, 1003])
def test_cut_rows(top_k, top_p, vocab):
    u = uniforms(5, seed=vocab + top_k)
    opts = [(t, top_k, top_p, ui) for t, ui in zip([1.0, 0.6, 1.5, 1.0, 1.0], u, strict=True)]
    x = randn(5, vocab, seed=top_k)
    x[3] = x[3] / 10  # a flat row: a top-p cut keeps many tokens
    rows(x, [*opts[:4], (1.0, top_k, top_p, LAST_U)], block=128)


def test_ties_at_the_threshold_are_kept_together():
    # Values 0..4 (exact in float32), 30 tokens at each: a cut inside a tie keeps all of it.
    # (The top value holds 0.64 of the mass, the top two 0.87.)
    vocab, n = 150, 48
    order = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))
    x = (torch.arange(vocab) % 5).float()[order]
    u = [(j + 0.5) / n for j in range(n)]  # closer than any kept token's share of the mass
    for top_k, top_p, kept in [(3, 1.0, {4}), (31, 1.0, {4, 3}), (-1, 0.7, {4, 3})]:
        opts = [(1.0, top_k, top_p, ui) for ui in u]
        got, bad = rows(x.expand(n, -1).contiguous(), opts, block=None)
        assert not bad.any() and {int(x[t]) for t in got.tolist()} == kept, (top_k, top_p)
        assert set(got.tolist()) >= set((x == 4).nonzero().flatten().tolist()), "every tied top"


def test_rows_with_nothing_to_sample_are_bad():
    x = randn(8, 130)
    x[0:2] = -INF  # greedy and random: all -inf
    x[2:4, 100] = NAN  # a NaN, greedy and random
    x[4, 3] = INF  # random with +inf: inf - inf is NaN
    x[5, 3] = INF  # greedy with +inf: its argmax
    x[6] = -INF
    x[6, 129] = 1.0  # one finite token, in the last chunk
    x[7, :120] = -INF  # a few finite tokens with a top-p cut
    greedy, cut = (0.0, 0, 1.0, 0.5), (1.0, 5, 0.9, 0.5)
    opts = [greedy, cut, greedy, cut, (1.0, -1, 1.0, 0.5), greedy, (0.8, 3, 0.5, LAST_U),
            (1.0, 4, 0.7, 0.9)]  # fmt: skip
    got, bad = rows(x, opts)
    assert bad.tolist() == [True, True, True, True, True, False, False, False]
    assert got[5] == 3 and got[6] == 129 and got[7] >= 120


def test_a_mixed_batch_of_every_kind():
    vocab = 777
    x = randn(12, vocab, seed=5)
    x[9, 3] = NAN
    opts = [(0.0, 0, 1.0, 0.0), (1.0, -1, 1.0, 0.3), (0.7, 10, 1.0, 0.6), (1.0, -1, 0.8, 0.1),
            (1.2, 50, 0.9, 0.95), (0.0, 5, 0.5, 0.4), (1.0, 1, 1.0, 0.5), (2.0, -1, 1e-7, 0.7),
            (1.0, vocab, 1.0, 0.2), (1.0, -1, 1.0, 0.5), (0.5, 0, 0.99, LAST_U),
            (1.0, 3, 0.6, 0.0)]  # fmt: skip
    rows(x, opts, block=None)


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(
    vocab=st.sampled_from([50, 61, 128, 300, 1001]),
    seed=st.integers(0, 2**31),
    steps=st.sampled_from([0.0, 0.5, 2.0]),  # 0: continuous logits; else ties on a grid
    opts=st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.3, 1.0, 1.7]),
            st.sampled_from([-1, 0, 1, 2, 5, 40, 60, 1001]),
            st.sampled_from([1.0, 0.95, 0.6, 0.2, 1e-4]),
            st.floats(0.0, LAST_U),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_random_batches(vocab, seed, steps, opts):
    x = randn(len(opts), vocab, seed=seed)
    if steps:
        x = torch.round(x * steps) / steps
    rows(x, opts, block=64)


# ---------------------------------------------------------------- torch path == plain reference


def plain_sample(x: torch.Tensor, t: float, k: int, p: float, u: float) -> int:
    """The semantics of kernels/sampling.py written out for one row of finite logits."""
    vocab = len(x)
    if t == 0:
        values = x.tolist()
        return values.index(max(values))
    s = x / torch.tensor(t, dtype=torch.float32)  # float32, correctly rounded
    w = (s - s.max()).exp().double().tolist()
    values = s.tolist()
    ordered = sorted(values, reverse=True)
    t_k = ordered[k - 1] if 0 < k < vocab else -INF
    kept = [v >= t_k for v in values]
    if p < 1.0:
        need = float(torch.tensor(p, dtype=torch.float32)) * math.fsum(
            w[i] for i in range(vocab) if kept[i]
        )
        for v in sorted({v for v, keep in zip(values, kept, strict=True) if keep}):  # ascending
            above = sum(w[i] for i in range(vocab) if kept[i] and values[i] > v)
            if above < need:
                kept = [keep and values[i] >= v for i, keep in enumerate(kept)]
                break
    cdf, running = [], 0.0
    for i in range(vocab):
        running += w[i] if kept[i] else 0.0
        cdf.append(running)
    target = u * running
    if target >= running:
        return next(i for i, c in enumerate(cdf) if c >= target)
    return next(i for i, c in enumerate(cdf) if c > target)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    vocab=st.integers(2, 40),
    seed=st.integers(0, 2**31),
    steps=st.sampled_from([0.0, 1.0, 4.0]),
    t=st.sampled_from([0.0, 0.5, 1.0, 2.5]),
    k=st.integers(-1, 45),
    p=st.sampled_from([1.0, 0.99, 0.7, 0.35, 0.05]),
    u=st.floats(0.0, LAST_U),
)
def test_the_torch_path_follows_the_plain_reference(vocab, seed, steps, t, k, p, u):
    x = randn(1, vocab, seed=seed)
    if steps:
        x = torch.round(x * steps) / steps
    args = (torch.tensor([t]), torch.tensor([k]), torch.tensor([p]), torch.tensor([u]))
    token, bad = torch_sample(x, *args)
    assert not bad.item()
    assert token.item() == plain_sample(x[0], t, k, p, u)


def test_a_top_k_threshold_keeps_ties_together():
    tied = torch.tensor([[3.0, 1.0, 3.0, 1.0, 0.0]])
    threshold = sampling.cut_thresholds(tied, torch.tensor([1]), torch.tensor([1.0]))
    assert threshold.tolist() == [3.0]  # both 3.0s kept at top-k 1


# ---------------------------------------------------------------- sampler and engine on triton


@pytest.fixture
def forced(monkeypatch):  # type: ignore[no-untyped-def]
    def force(impl: str) -> None:
        monkeypatch.setenv(dispatch.FORCE_VAR, f"sampling={impl}")
        dispatch.refresh()

    yield force
    monkeypatch.delenv(dispatch.FORCE_VAR, raising=False)
    dispatch.refresh()


def mixed_requests() -> list[Request]:
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=3),
              SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_p=0.9, seed=4),
              SamplingParams(temperature=0.6, top_k=7), SamplingParams(temperature=1.1, top_k=30,
              top_p=0.8), SamplingParams(temperature=1.0, seed=9)] * 3  # fmt: skip
    return [Request(f"r{i}", [1], p) for i, p in enumerate(params)]


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_the_sampler_on_either_path_picks_the_same_tokens(forced, impl):
    reqs = mixed_requests()
    logits = randn(len(reqs), 300, seed=11)
    logits[4, 8] = NAN  # a random row fails alone
    logits[7, 2] = NAN  # and a greedy one
    out = {}
    for path in ("torch", impl):
        forced(path)
        sampler = Sampler(torch.device(DEVICE), seed=0)
        out[path] = [sampler.sample(logits.clone().to(DEVICE), reqs).token_ids for _ in range(2)]
        tokens, failed = sampler.sample_on_device(logits.to(DEVICE), reqs)
        assert tokens.device.type == failed.device.type == DEVICE
    kinds = [[type(t) if isinstance(t, Exception) else t for t in step] for step in out[impl]]
    assert kinds == [[type(t) if isinstance(t, Exception) else t for t in s] for s in out["torch"]]
    assert [i for i, t in enumerate(out[impl][0]) if isinstance(t, NoTokenToSample)] == [4, 7]


@pytest.mark.slow
def test_an_engine_samples_the_same_tokens_on_triton(forced, tiny_path):
    prompts = [[1, 50, 60], [1, 70], [1, 30, 31, 32], [1, 90]]
    params = [SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, top_k=50, seed=1234),
              SamplingParams(max_tokens=8, temperature=0.0),
              SamplingParams(max_tokens=8, temperature=0.8, top_k=5, seed=7),
              SamplingParams(max_tokens=8, temperature=1.3, top_p=0.7, seed=99)]  # fmt: skip
    tokens, launches = {}, {}
    for impl in ("torch", "triton"):
        forced(impl)
        engine = make_engine(tiny_path)
        with record_launches() as launches[impl]:
            tokens[impl] = [out.token_ids for out in engine.generate(prompts, params)]
    assert tokens["triton"] == tokens["torch"]
    assert [key[0] for key in launches["triton"] - launches["torch"]] == ["sample"]
    assert all(len(t) == 8 for t in tokens["torch"])
