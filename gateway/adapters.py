"""The LoRA adapters as the gateway sees them: each one checked against its parent's config
(infra/contract/adapters.py, torch-free: only the safetensors header is read), and its rank
and targets remembered for the model cards.

The gateway never loads an adapter's weights: a worker of the parent does, when the first
job naming it arrives. Here an adapter is checked when an operator loads it
(``POST /v1/adapters``) and, for the cards, read once per (name, path) where that is cheap:
a local folder. An ``s3://`` adapter loaded through another gateway has no rank on this
one's cards rather than a download on a listing.
"""

from __future__ import annotations

import logging

import anyio

from tide_fleet.gateway.deps import GatewayState
from tide_fleet.infra.contract.adapters import AdapterError, AdapterSpec, read_adapter
from tide_fleet.infra.contract.registry import adapter_cache_dir
from tide_fleet.infra.wire.adapters import AdapterRef

log = logging.getLogger(__name__)


def check_adapter(state: GatewayState, name: str, parent: str, path: str) -> AdapterSpec:
    """Read and check the adapter at `path` against the served model `parent` (its config
    loaded); AdapterError names what does not fit. Blocking: run it in a thread."""
    config = state.models[parent].config
    spec = read_adapter(name, path, config, cache_dir=adapter_cache_dir())
    state.adapter_specs[(name, path)] = spec
    return spec


def _read_cached(state: GatewayState, ref: AdapterRef) -> AdapterSpec | None:
    key = (ref.name, ref.path)
    if key in state.adapter_specs:
        return state.adapter_specs[key]
    if ref.path.startswith("s3://") or ref.parent not in state.models:
        return None
    try:
        return check_adapter(state, ref.name, ref.parent, ref.path)
    except AdapterError as e:  # the workers refuse its jobs, naming the same reason
        log.warning("adapter %r on %r: %s", ref.name, ref.parent, e)
        state.adapter_specs[key] = None  # said once: not read again for every listing
        return None


async def specs(state: GatewayState, refs: list[AdapterRef]) -> dict[str, AdapterSpec]:
    """The checked spec of each adapter where one is known or cheap to read, by name."""
    missing = [r for r in refs if (r.name, r.path) not in state.adapter_specs]
    if missing:  # a folder's header: milliseconds, but file I/O all the same
        await anyio.to_thread.run_sync(lambda: [_read_cached(state, r) for r in missing])
    found = {r.name: state.adapter_specs.get((r.name, r.path)) for r in refs}
    return {name: spec for name, spec in found.items() if spec is not None}
