"""Property tests of scheduler + block manager (pure Python, no model)."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tide_fleet.infra.contract.sampling_params import Priority, SamplingParams
from tide_fleet.worker.engine.block_manager import BlockManager
from tide_fleet.worker.engine.config import EngineConfig
from tide_fleet.worker.engine.request import Request
from tide_fleet.worker.engine.scheduler import Scheduler
from tide_fleet.worker.engine.step_inputs import build_step_inputs

request_spec = st.tuples(
    st.integers(0, 6),  # arrival step
    st.lists(
        st.integers(0, 5), min_size=1, max_size=70
    ),  # prompt (small alphabet: shared prefixes)
    st.integers(1, 24),  # max_tokens
    st.sampled_from(list(Priority)),
    st.one_of(st.none(), st.integers(0, 30)),  # abort at this step
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(request_spec, min_size=1, max_size=14),
    block_size=st.sampled_from([1, 2, 4, 16]),
    extra_blocks=st.integers(0, 12),
    budget=st.integers(1, 64),
    max_seqs=st.integers(1, 6),
    prefix=st.booleans(),
)
def test_every_request_finishes_and_nothing_leaks(
    specs, block_size, extra_blocks, budget, max_seqs, prefix
):
    longest = max(len(p) + m for _, p, m, _, _ in specs)
    num_blocks = -(-longest // block_size) + extra_blocks
    config = EngineConfig(
        block_size=block_size, max_num_batched_tokens=budget, max_num_seqs=max_seqs
    )
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=prefix)
    sched = Scheduler(config, bm)
    requests = [
        Request(f"r{i}", prompt, SamplingParams(max_tokens=m), prio, i)
        for i, (_, prompt, m, prio, _) in enumerate(specs)
    ]
    pending = sorted(range(len(specs)), key=lambda i: specs[i][0])
    finished: set[str] = set()
    for step in range(5000):
        while pending and specs[pending[0]][0] <= step:
            sched.add(requests[pending.pop(0)])
        for i, (_, _, _, _, abort_at) in enumerate(specs):
            r = requests[i]
            if abort_at == step and (r in sched.running or r in sched.waiting):
                sched.finish(r)
                finished.add(r.request_id)
        out = sched.schedule()
        assert out.num_tokens <= budget
        # The runner samples exactly the rows the scheduler marked (one-token prefill
        # chunks included), and every slot lies inside the request's blocks.
        step = build_step_inputs(out.scheduled, block_size, torch.device("cpu"))
        assert sorted(step.sampled_ids) == sorted(s.request_id for s in out.scheduled if s.sample)
        assert all(0 <= slot < num_blocks * block_size for slot in step.meta.slot_mapping.tolist())
        assert len(sched.running) <= max_seqs
        for s in out.scheduled:
            r = next(x for x in requests if x.request_id == s.request_id)
            assert s.start_pos == r.num_computed_tokens
            assert len(bm.get_block_table(r.request_id)) * block_size >= s.context_len
            r.num_computed_tokens += s.num_tokens
            bm.cache_full_blocks(r)
            if s.sample:
                # A deterministic "model": the next token depends on the sequence so far.
                r.append_token(sum(r.all_token_ids) % 6)
                if r.num_output_tokens >= r.params.max_tokens:
                    sched.finish(r)
                    finished.add(r.request_id)
        bm.check_invariants()
        if not pending and sched.num_unfinished == 0:
            break
    assert finished == {r.request_id for r in requests}, "some request never finished"
    for r in requests:
        assert r.num_output_tokens <= r.params.max_tokens
    bm.assert_all_free()
