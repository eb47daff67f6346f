"""Adapter slots in the engine: registration, host and device LRU, pins, admission, and
the slots' bytes counted in the KV budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lora_fixtures import make_adapter
from tide_fleet.infra.contract.sampling_params import SamplingParams
from tide_fleet.worker.engine.llm_engine import LLMEngine


@pytest.fixture(scope="module")
def folders(stories_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("slots")
    return {n: make_adapter(root / n, stories_path, 4, ("q_proj", "down_proj"), seed)
            for seed, n in enumerate("abc")}  # fmt: skip


def _engine(stories_path: Path, **config) -> LLMEngine:
    return LLMEngine.from_pretrained(str(stories_path), dtype="float32",
                                     kv_cache_memory=16 << 20, **config)  # fmt: skip


def test_slots_evict_the_least_recently_used_unpinned_adapter(stories_path, folders):
    engine = _engine(stories_path, max_loras=2, max_cpu_loras=2)
    m = engine.loras
    assert m is not None
    for name, folder in folders.items():
        engine.register_adapter(name, str(folder))
    assert list(m.host) == ["b", "c"]  # host memory holds two; "a" is read again when needed
    m.pin("a"), m.pin("b")
    assert not m.can_run("c")  # both slots held by running requests
    m.unpin("a")
    assert m.can_run("c")
    m.pin("c")
    assert sorted(m.on_device()) == ["b", "c"] and m.evictions == 1 and m.loads == 3
    with pytest.raises(ValueError, match="in use by 1 running"):
        m.unregister("b")


def test_a_request_waits_for_a_slot_while_base_requests_pass_it(stories_path, folders):
    engine = _engine(stories_path, max_loras=1)
    for name, folder in folders.items():
        engine.register_adapter(name, str(folder))
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.add_request("a", [1, 5, 6], params, lora="a")
    engine.step()
    assert engine.adapters_on_device() == ["a"]
    assert not engine.can_admit(3, 4, lora="b") and engine.can_admit(3, 4)
    engine.add_request("b", [1, 5, 6], params, lora="b")
    engine.add_request("base", [1, 5, 6], params)
    engine.step()
    running = {r.request_id for r in engine.scheduler.running}
    assert running == {"a", "base"}  # b waits behind a's pinned slot; the base does not
    while engine.has_unfinished():
        engine.step()
    assert engine.adapters_on_device() == ["b"]
    engine.block_manager.assert_all_free()


def test_unknown_adapters_and_engines_without_slots_are_refused(stories_path, folders):
    engine = _engine(stories_path, max_loras=1)
    with pytest.raises(ValueError, match="lora: adapter 'nope' is not registered"):
        engine.add_request("x", [1, 2], SamplingParams(), lora="nope")
    plain = _engine(stories_path)
    with pytest.raises(ValueError, match="serves no adapters"):
        plain.register_adapter("a", str(folders["a"]))
    engine.register_adapter("a", str(folders["a"]))
    with pytest.raises(ValueError, match="registered from"):
        engine.register_adapter("a", str(folders["b"]))


def test_reregistering_a_name_gets_a_new_prefix_root(stories_path, folders):
    engine = _engine(stories_path, max_loras=1)
    engine.register_adapter("a", str(folders["a"]))
    first = engine.loras.salt("a")
    assert engine.unregister_adapter("a")
    engine.register_adapter("a", str(folders["b"]))
    assert engine.loras.salt("a") not in (first, 0)


def test_the_slots_bytes_come_out_of_the_kv_budget(stories_path):
    plain = _engine(stories_path)
    adapted = _engine(stories_path, max_loras=4, max_lora_rank=64)
    lora_bytes = adapted.loras.nbytes
    assert lora_bytes > 0
    fewer = plain.block_manager.num_blocks - adapted.block_manager.num_blocks
    assert fewer == pytest.approx(lora_bytes / plain.runner.block_bytes, abs=1)
