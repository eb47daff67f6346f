"""The workload: arrivals, lengths, prompts, traces, and the spec drawn from flags."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from tide_fleet.infra.bench.scenarios import build
from tide_fleet.infra.bench.workload import (
    LengthClass,
    PromptMaker,
    WorkloadSpec,
    arrival_offsets,
    build_workload,
    draw_lengths,
    workload_spec,
)
from tide_fleet.infra.cli.main import build_parser
from tide_fleet.infra.traces import read_request_trace


def _gaps(rate: float, burstiness: float, n: int = 20_000, seed: int = 3) -> list[float]:
    times = arrival_offsets(n, rate, burstiness, random.Random(seed))
    return [b - a for a, b in itertools.pairwise(times)]


def test_poisson_arrivals_have_the_rate_and_cv_one():
    gaps = _gaps(rate=10.0, burstiness=1.0)
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.03)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_arrivals_keep_the_rate_and_have_cv_one_over_sqrt_burstiness(burstiness):
    gaps = _gaps(rate=5.0, burstiness=burstiness)
    assert statistics.fmean(gaps) == pytest.approx(0.2, rel=0.05)
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)


def test_arrivals_are_seeded_start_at_zero_and_infinite_rate_sends_at_once():
    a = arrival_offsets(50, 3.0, 1.0, random.Random(1))
    assert a == arrival_offsets(50, 3.0, 1.0, random.Random(1))
    assert a != arrival_offsets(50, 3.0, 1.0, random.Random(2))
    assert a[0] == 0.0 and a == sorted(a)
    assert arrival_offsets(4, math.inf, 1.0, random.Random(0)) == [0.0] * 4
    with pytest.raises(ValueError, match="rate and burstiness must be positive"):
        arrival_offsets(4, 0.0, 1.0, random.Random(0))


def test_length_mix_is_80_20_heavy_tailed_and_capped():
    classes = [
        LengthClass("short", 0.8, 32, 32, 100),
        LengthClass("long", 0.2, 300, 200, 500),
    ]
    rng = random.Random(0)
    draws = [draw_lengths(classes, 0.8, rng) for _ in range(5000)]
    kinds = [k for k, _, _ in draws]
    assert kinds.count("long") / len(kinds) == pytest.approx(0.2, abs=0.02)
    for kind, prompt, output in draws:
        cap = 100 if kind == "short" else 500
        assert prompt >= 2 and output >= 1 and prompt + output <= cap
    short_prompts = [p for k, p, _ in draws if k == "short"]
    assert statistics.median(short_prompts) == pytest.approx(32, rel=0.1)
    assert max(short_prompts) > 2.5 * 32  # the lognormal tail reaches well past the median


def test_prompts_have_the_requested_token_count(tiny_path):
    from tide_fleet.infra.contract.tokenizer import Tokenizer

    tok = Tokenizer(tiny_path)
    maker = PromptMaker(tok, random.Random(0))
    for n in (2, 7, 64, 300):
        assert len(tok.encode(maker.make(n))) == n
    assert len(tok.encode(maker.make(20, first=False), False)) == 20


def test_prompts_fit_a_subword_tokenizer_closely(stories_path):
    from tide_fleet.infra.contract.tokenizer import Tokenizer

    tok = Tokenizer(stories_path)
    maker = PromptMaker(tok, random.Random(0))
    for n in (5, 40, 200):
        assert abs(len(tok.encode(maker.make(n))) - n) <= 2


def test_shared_prefix_workload_repeats_the_prefix(tiny_path):
    from tide_fleet.infra.contract.tokenizer import Tokenizer

    spec = WorkloadSpec(
        num_requests=6, request_rate=2.0, classes=[LengthClass("short", 1, 8, 4, 64)],
        shared_prefix_len=40,
    )  # fmt: skip
    items = build_workload(spec, Tokenizer(tiny_path))
    heads = {it.prompt[:30] for it in items}
    assert len(heads) == 1 and len({it.prompt for it in items}) == 6
    assert items == build_workload(spec, Tokenizer(tiny_path))  # seeded


# -- traces and flags ------------------------------------------------------------------


def _trace(tmp_path, lines: list[str]):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_trace_workload_keeps_offsets_and_sizes_prompts(tmp_path):
    path = _trace(tmp_path, [
        '{"prompt": "Once upon a time", "max_tokens": 5, "offset": 0.5}',
        "",
        '{"prompt_len": 12, "max_tokens": 3, "offset": 0}',
    ])  # fmt: skip
    rows = read_request_trace(path)
    items = build_workload(WorkloadSpec(num_requests=10, trace=rows), None)
    assert [(i.arrival, i.max_tokens, i.kind) for i in items] == [
        (0, 3, "trace"),
        (0.5, 5, "trace"),
    ]
    assert len(items[0].prompt.split()) == 12  # no tokenizer: one word per token


def test_flags_override_the_scenario_workload_which_overrides_the_general_defaults():
    defaults = build("buckets", 512).workload
    spec = workload_spec(build_parser().parse_args(["bench"]), 512, defaults)
    assert (spec.num_requests, spec.request_rate, spec.burstiness) == (300, 20.0, 0.4)
    short, long_ = spec.classes
    assert (short.share, short.max_total, long_.max_total) == (0.8, 128, 512)
    args = build_parser().parse_args(["bench", "--burstiness", "2", "--long-fraction", "0"])
    spec = workload_spec(args, 512, defaults)
    assert spec.burstiness == 2.0 and [c.name for c in spec.classes] == ["short"]
    general = workload_spec(build_parser().parse_args(["bench"]), 512, {})
    assert (general.num_requests, general.request_rate, general.burstiness) == (50, 5.0, 1.0)
