"""The planner: the design's worked examples, real parameter counts, the roofline, the CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, STORIES
from tide_fleet.infra.cli.main import main
from tide_fleet.infra.plan.devices import DEVICES, DeviceSpec, GiB, get_device
from tide_fleet.infra.plan.planner import (
    MEDIUM_MIN_CONCURRENT,
    PRESETS,
    SHORT_MIN_CONCURRENT,
    ModelShape,
    PlanError,
    estimate_decode_tokens_per_s,
    estimate_pool_tokens_per_s,
    kv_bytes,
    plan,
)
from tide_fleet.infra.plan.roofline import ModelCost

LLAMA2_7B = ModelShape.from_preset("llama-2-7b")
MiB, KiB = 1 << 20, 1 << 10
REQUIRED_KEYS = {
    "weight_bytes",
    "kv_bytes_per_token",
    "kv_budget_bytes",
    "max_concurrent_seqs",
    "recommended_max_num_seqs",
    "recommended_max_num_batched_tokens",
}

# HF config.json files as published (extra keys included: the reader must ignore them).
HF_CONFIGS = {
    "llama-3-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "qwen2-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
    },
}


# --- the design's worked examples ------------------------------------------------------------


def test_kv_per_token_of_a_7b_llama_is_512_kib_at_fp16():
    assert LLAMA2_7B.kv_bytes_per_token("float16") == 2 * 32 * 32 * 128 * 2 == 512 * KiB
    assert kv_bytes(LLAMA2_7B, 1024, 1, "float16") == 512 * MiB
    assert kv_bytes(LLAMA2_7B, 4096, 1, "float16") == 2 * GiB


def test_seed_sequence_times_batch_figures():
    # At fp16 K+V the formula gives twice the design's figures ...
    assert kv_bytes(LLAMA2_7B, 2048, 8, "float16") == 8 * GiB
    assert kv_bytes(LLAMA2_7B, 8192, 16, "float16") == 64 * GiB
    # ... which hold for an 8-bit KV cache.
    for kv_dtype in ("fp8", "int8"):
        assert kv_bytes(LLAMA2_7B, 2048, 8, kv_dtype) == 4 * GiB
        assert kv_bytes(LLAMA2_7B, 8192, 16, kv_dtype) == 32 * GiB


def _rtx3090(avg_len: int, **kw) -> dict:
    p = plan(
        LLAMA2_7B,
        device=get_device("rtx3090"),
        weight_dtype="float16",
        prompt_len=avg_len - 256,
        output_len=256,
        p99_len=4096,
        **kw,
    )
    return p.to_dict()


def test_rtx3090_with_8_gib_of_kv_holds_16_at_1k_and_4_at_4k():
    d = _rtx3090(1024, kv_budget_bytes=8 * GiB)
    assert d["kv_budget_bytes"] == 8 * GiB
    assert d["max_concurrent_seqs"] == 16
    assert d["max_concurrent_seqs_p99"] == 4
    assert _rtx3090(4096, kv_budget_bytes=8 * GiB)["max_concurrent_seqs"] == 4


def test_rtx3090_budget_derived_from_memory():
    # No headroom and a reserve that leaves exactly 8 GiB after the real fp16 weights.
    weights = LLAMA2_7B.weight_bytes("float16")
    reserve = 24 * GiB - weights - 8 * GiB
    d = _rtx3090(1024, headroom=0.0, reserve_bytes=reserve)
    assert d["memory_bytes"] == 24 * GiB and d["weight_bytes"] == weights
    assert d["kv_budget_bytes"] == 8 * GiB
    assert (d["max_concurrent_seqs"], d["max_concurrent_seqs_p99"]) == (16, 4)
    # The default 20% headroom takes 4.8 GiB of it.
    assert _rtx3090(1024, reserve_bytes=reserve)["kv_budget_bytes"] < 8 * GiB - 4 * GiB


# --- shapes --------------------------------------------------------------------------------

KNOWN_PARAMS = {  # the spec's rounded figures, and the exact published counts
    "llama-2-7b": (6.74e9, 6_738_415_616),
    "llama-3-8b": (8.03e9, 8_030_261_248),
    "mistral-7b": (7.24e9, 7_241_732_096),
    "qwen2-7b": (7.62e9, 7_615_616_512),
}


@pytest.mark.parametrize("name", sorted(KNOWN_PARAMS))
def test_preset_weight_bytes_match_known_parameter_counts(name):
    rounded, exact = KNOWN_PARAMS[name]
    shape = ModelShape.from_preset(name)
    assert shape.weight_bytes("bfloat16") == pytest.approx(2 * rounded, rel=0.03)
    assert shape.num_parameters() == exact
    assert shape.weight_bytes("fp8") * 4 == shape.weight_bytes("float32")


def test_parameter_count_matches_real_checkpoint():
    if not (STORIES / "model.safetensors").is_file():
        pytest.skip(f"fixture model not found at {STORIES}")
    from safetensors import safe_open

    with safe_open(str(STORIES / "model.safetensors"), "numpy") as f:
        total = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
    assert ModelShape.from_file(STORIES).num_parameters() == total


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_config_json_equals_preset(tmp_path, name):
    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIGS[name]))
    from_file = ModelShape.from_file(tmp_path / "config.json")
    assert from_file == ModelShape.from_preset(name)
    assert ModelShape.from_file(tmp_path) == from_file  # a model folder works too
    a = plan(from_file, device=get_device("a100-80gb")).to_dict()
    b = plan(ModelShape.from_preset(name), device=get_device("a100-80gb")).to_dict()
    assert {k: v for k, v in a.items() if k != "model"} == {
        k: v for k, v in b.items() if k != "model"
    }


# --- plan consistency ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("device", ["l4", "a100-80gb", "h200"])
def test_plan_keys_are_consistent(name, device):
    shape = ModelShape.from_preset(name)
    try:
        d = plan(shape, device=get_device(device), prompt_len=1000, output_len=300).to_dict()
    except PlanError as e:
        assert "do not fit" in str(e)  # 70B on one small card
        return
    assert d.keys() >= REQUIRED_KEYS
    kvpt = d["kv_bytes_per_token"]
    assert kvpt == 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * 2
    assert d["weight_bytes"] == shape.num_parameters() * 2
    assert d["kv_budget_bytes"] == d["usable_bytes"] - d["weight_bytes"] - d["reserve_bytes"]
    assert d["max_concurrent_seqs"] == d["kv_budget_bytes"] // (kvpt * 1300)
    assert d["max_concurrent_seqs_p99"] == d["kv_budget_bytes"] // (kvpt * 4096)
    assert 1 <= d["recommended_max_num_seqs"] <= min(d["max_concurrent_seqs"], 256)
    assert d["recommended_max_num_batched_tokens"] > d["recommended_max_num_seqs"]
    assert d["decode_tokens_per_s"] > d["decode_tokens_per_s_batch1"] > 0


@settings(max_examples=60, deadline=None)
@given(
    budget_mib=st.integers(64, 200_000),
    prompt_len=st.integers(1, 8000),
    output_len=st.integers(1, 4000),
    device=st.sampled_from(sorted(DEVICES)),
)
def test_bucket_thresholds_follow_the_rule(budget_mib, prompt_len, output_len, device):
    shape = ModelShape.from_preset("llama-3-8b")
    try:
        p = plan(
            shape,
            10**15,
            device=get_device(device),
            prompt_len=prompt_len,
            output_len=output_len,
            kv_budget_bytes=budget_mib * MiB,
        )
    except PlanError as e:
        assert "less than one average request" in str(e)
        assert budget_mib * MiB < shape.kv_bytes_per_token("bfloat16") * (prompt_len + output_len)
        return
    tokens = p.kv_budget_tokens
    assert tokens == budget_mib * MiB // p.kv_bytes_per_token
    for threshold in (p.bucket_short_max, p.bucket_medium_max):
        assert threshold & (threshold - 1) == 0  # a power of two
    if tokens >= 16 * SHORT_MIN_CONCURRENT:  # the largest power of two that fits n times
        assert p.bucket_short_max * SHORT_MIN_CONCURRENT <= tokens
        assert 2 * p.bucket_short_max * SHORT_MIN_CONCURRENT > tokens
    assert p.bucket_medium_max > p.bucket_short_max
    if p.bucket_medium_max > 2 * p.bucket_short_max:
        assert p.bucket_medium_max * MEDIUM_MIN_CONCURRENT <= tokens
    assert p.recommended_max_num_seqs <= p.max_concurrent_seqs


def test_memory_only_plan_has_no_roofline():
    d = plan(LLAMA2_7B, 40 * GiB).to_dict()
    assert d["device"] is None and d["decode_tokens_per_s"] is None
    assert d["recommended_max_num_batched_tokens"] == d["recommended_max_num_seqs"] + 2048


# --- roofline ------------------------------------------------------------------------------


def test_decode_roofline_batch1_is_bandwidth_over_bytes_read():
    h100 = get_device("h100")
    rate = estimate_decode_tokens_per_s(LLAMA2_7B, h100, 1, 1000, "float16", "float16")
    read = LLAMA2_7B.streamed_parameters() * 2 + 1000 * 512 * KiB
    assert rate == pytest.approx(h100.mem_bandwidth / read)
    # A bigger batch reads the weights once for all: more tokens/s, less than linear.
    rate_32 = estimate_decode_tokens_per_s(LLAMA2_7B, h100, 32, 1000, "float16", "float16")
    read_32 = LLAMA2_7B.streamed_parameters() * 2 + 32 * 1000 * 512 * KiB
    assert rate_32 == pytest.approx(32 * h100.mem_bandwidth / read_32)
    assert rate < rate_32 < 32 * rate
    assert estimate_decode_tokens_per_s(LLAMA2_7B, h100, 1, 1000, "float16", efficiency=0.5) == (
        pytest.approx(rate / 2)
    )


def test_decode_roofline_is_capped_by_compute():
    slow = DeviceSpec("slow", 80 * GiB, 3e12, 1e12, 1e11)  # 1 TFLOP/s: compute bound early
    rate = estimate_decode_tokens_per_s(LLAMA2_7B, slow, 64, 100, "bfloat16")
    assert rate == pytest.approx(1e12 / ModelCost.from_shape(LLAMA2_7B).flops_per_token(100))
    p = plan(LLAMA2_7B, device=slow, prompt_len=64, output_len=72)
    assert p.decode_bound == "compute"
    # The batch stops where more sequences add no throughput.
    assert p.recommended_max_num_seqs < min(p.max_concurrent_seqs, 256)
    assert p.decode_tokens_per_s == pytest.approx(
        estimate_decode_tokens_per_s(LLAMA2_7B, slow, p.recommended_max_num_seqs, 100)
    )


def test_work_rate_adds_prefill_to_decode_time():
    l4 = get_device("l4")
    p = plan(LLAMA2_7B, device=l4, prompt_len=1000, output_len=200)
    assert p.decode_tokens_per_s is not None and p.work_tokens_per_s is not None
    prefill_s = 1000 * ModelCost.from_shape(LLAMA2_7B).flops_per_token(500) / l4.peak_flops_16bit
    per_request_s = 200 / p.decode_tokens_per_s + prefill_s
    assert p.work_tokens_per_s == pytest.approx(1200 / per_request_s)
    # Decode-only work would be faster: prefill costs something.
    assert p.work_tokens_per_s < 1200 / (200 / p.decode_tokens_per_s)


def test_pool_rate_for_the_controller():
    from tide_fleet.infra.fleet.fleet_config import PoolConfig

    pool = PoolConfig(buckets=["short"], device="l4", model="llama-3-8b")
    expected = plan(ModelShape.from_preset("llama-3-8b"), device=get_device("l4"))
    assert expected.work_tokens_per_s is not None
    assert estimate_pool_tokens_per_s(pool) == pytest.approx(0.6 * expected.work_tokens_per_s)
    assert estimate_pool_tokens_per_s(pool, efficiency=1.0) == expected.work_tokens_per_s
    with pytest.raises(ValueError, match="names no model"):
        estimate_pool_tokens_per_s(PoolConfig(buckets=["short"], device="l4"))


# --- errors --------------------------------------------------------------------------------


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match=r"unknown preset 'gpt-5'.*llama-2-7b.*qwen2-7b"):
        ModelShape.from_preset("gpt-5")
    with pytest.raises(ValueError, match=r"missing file: .*nope\.json"):
        ModelShape.from_file(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON"):
        ModelShape.from_file(bad)
    cfg = dict(HF_CONFIGS["llama-3-8b"])
    del cfg["num_hidden_layers"]
    bad.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"bad\.json: missing field 'num_hidden_layers'"):
        ModelShape.from_file(bad)
    bad.write_text(json.dumps({**HF_CONFIGS["llama-3-8b"], "hidden_size": "big"}))
    with pytest.raises(ValueError, match=r"bad\.json: field 'hidden_size' must be a positive"):
        ModelShape.from_file(bad)
    with pytest.raises(PlanError, match=r"131\.42 GiB of bfloat16 weights.*19\.20 GiB usable"):
        plan(ModelShape.from_preset("llama-3.1-70b"), device=get_device("a10g"))
    for bad_headroom in (-0.1, 0.95):
        with pytest.raises(PlanError, match=r"headroom must be in \[0, 0.9\]"):
            plan(LLAMA2_7B, 80 * GiB, headroom=bad_headroom)
    for field in ("prompt_len", "output_len", "p99_len"):
        with pytest.raises(PlanError, match=f"{field} must be a positive"):
            plan(LLAMA2_7B, 80 * GiB, **{field: 0})
    with pytest.raises(ValueError, match="unknown dtype 'fp4'"):
        plan(LLAMA2_7B, 80 * GiB, kv_dtype="fp4")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "gpt-5", "--device", "h100"], "unknown preset 'gpt-5'; presets: llama-2-7b"),
        (["--model", "missing/config.json", "--device", "h100"], "missing file: missing/"),
        (["--model", "llama-3.1-70b", "--device", "l4"], "weights do not fit: 131.42 GiB"),
        (["--model", "llama-2-7b", "--device", "h100", "--headroom", "0.91"], "--headroom: must"),
        (["--model", "llama-2-7b", "--memory-gb", "24", "--p99-len", "-5"], "--p99-len: must be"),
        (["--model", "llama-2-7b", "--device", "tpu"], "unknown device 'tpu'; known:"),
    ],
)
def test_cli_errors(argv, message, capsys):
    try:
        rc = main(["plan", *argv])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    assert rc == 2
    assert message in capsys.readouterr().err


def test_cli_table(capsys):
    assert main(["plan", "--model", "mistral-7b", "--device", "l40s"]) == 0
    out = capsys.readouterr().out
    for text in ("mistral-7b on l40s", "KV budget", "max_num_seqs", "decode, batch 1", "--max"):
        assert text in out


def test_cli_json_subprocess():
    args = ["--model", "llama-2-7b", "--device", "rtx3090", "--weight-dtype", "float16"]
    args += ["--kv-budget-gb", "8", "--prompt-len", "768", "--output-len", "256", "--json"]
    r = _python("-m", "tide_fleet.infra.cli", "plan", *args)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d.keys() >= REQUIRED_KEYS
    assert d["kv_bytes_per_token"] == 512 * KiB and d["max_concurrent_seqs"] == 16
    expected = plan(
        LLAMA2_7B,
        device=get_device("rtx3090"),
        weight_dtype="float16",
        prompt_len=768,
        output_len=256,
        kv_budget_bytes=8 * GiB,
    )
    assert d == expected.to_dict()


def test_planner_is_torch_free():
    code = (
        "import sys, tide_fleet.infra.plan.planner, tide_fleet.infra.cli.plan; "
        "assert 'torch' not in sys.modules"
    )
    r = _python("-c", code)
    assert r.returncode == 0, r.stderr


def _python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120
    )
