"""The adapters an engine serves: registered by name, cached in host memory, and held in a
fixed number of device slots that one step's rows index.

- ``register`` reads and checks an adapter (``infra/contract/adapters.py``) and keeps its
  tensors in host memory, at most ``max_cpu_loras`` of them (least recently used dropped;
  read from its files again when next needed).
- ``max_loras`` device slots, allocated once (their bytes come out of the KV budget). The
  scheduler admits a request only when its adapter holds a slot or can get one (a free slot,
  or one whose adapter no running request uses: least recently used first); ``pin`` loads it
  there, ``unpin`` releases it when the request stops running.
- ``salt`` roots the prefix cache's hash chain per registration, so KV computed under one
  adapter is never served to another, or to a later adapter of the same name.
"""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict
from pathlib import Path

import torch
import xxhash

from tide_fleet.infra.contract.adapters import MAX_RANK, AdapterSpec, read_adapter
from tide_fleet.infra.contract.model_config import ModelConfig
from tide_fleet.worker.lora.host import PROJECTIONS, Geometry, HostAdapter, load_host


class LoraManager:
    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, max_loras: int,
        max_cpu_loras: int | None = None, max_rank: int = 16, cache_dir: Path | None = None,
    ) -> None:  # fmt: skip
        if not 1 <= max_rank <= MAX_RANK:
            raise ValueError(f"max_lora_rank must be 1 to {MAX_RANK}, got {max_rank}")
        self.config, self.dtype, self.device = config, dtype, device
        self.max_loras, self.max_rank, self.cache_dir = max_loras, max_rank, cache_dir
        self.max_cpu_loras = max(max_cpu_loras or 0, max_loras)
        self.geometry = geo = Geometry.of(config)
        self.a: dict[str, list[torch.Tensor]] = {}
        self.b: dict[str, list[torch.Tensor]] = {}
        layers = range(config.num_layers)
        for proj in PROJECTIONS:
            n_sub, n_in, n_out = len(geo.subs[proj]), geo.inputs[proj], geo.outputs(proj)
            a_shape, b_shape = (max_loras, n_sub * max_rank, n_in), (max_loras, max_rank, n_out)
            self.a[proj] = [torch.zeros(a_shape, dtype=dtype, device=device) for _ in layers]
            # B stored rank-major, [slots, R, out] (the native CPU kernel's axpys read its
            # rows), used as its [slots, out, R] view (kernels/lora.py).
            self.b[proj] = [
                torch.zeros(b_shape, dtype=dtype, device=device).transpose(1, 2) for _ in layers
            ]
        self.slots: list[str | None] = [None] * max_loras
        self.recent: OrderedDict[str, None] = OrderedDict()  # slot holders, least recent first
        self.pins: Counter[str] = Counter()
        self.paths: dict[str, str] = {}
        self.specs: dict[str, AdapterSpec] = {}
        self.salts: dict[str, int] = {}
        self.host: OrderedDict[str, HostAdapter] = OrderedDict()
        self._generation = itertools.count(1)
        self.loads = self.evictions = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the device slots."""
        return sum(t.numel() * t.element_size() for d in (self.a, self.b) for ts in d.values()
                   for t in ts)  # fmt: skip

    def register(self, name: str, path: str) -> AdapterSpec:
        """Read, check and cache the adapter; the same name and path again is a no-op.
        AdapterError (a ValueError) names what does not fit the base or the slots."""
        if name in self.paths:
            if self.paths[name] != path:
                raise ValueError(
                    f"adapter {name!r} is registered from {self.paths[name]!r} already; "
                    f"unregister it before loading {path!r}"
                )
            return self.specs[name]
        spec = read_adapter(name, path, self.config, self.cache_dir, max_rank=self.max_rank)
        self._cache(name, load_host(spec, self.geometry, self.dtype))
        self.paths[name], self.specs[name] = path, spec
        seed = f"{name}\0{path}\0{next(self._generation)}".encode()
        self.salts[name] = xxhash.xxh3_64_intdigest(seed) or 1
        return spec

    def unregister(self, name: str) -> bool:
        """Forget an adapter no request runs under; False when it is not registered."""
        if name not in self.paths:
            return False
        if self.pins[name]:
            raise ValueError(f"adapter {name!r} is in use by {self.pins[name]} running requests")
        if name in self.recent:
            self.slots[self.slots.index(name)] = None
            del self.recent[name]
        for table in (self.paths, self.specs, self.salts, self.host):
            table.pop(name, None)
        return True

    def known(self, name: str) -> bool:
        return name in self.paths

    def salt(self, name: str | None) -> int:
        return 0 if name is None else self.salts[name]

    def on_device(self) -> list[str]:
        return [n for n in self.slots if n is not None]

    def can_run(self, name: str | None) -> bool:
        """Whether a request under `name` could start now: it holds a slot or can get one."""
        if name is None or name in self.recent:
            return True
        return None in self.slots or any(not self.pins[n] for n in self.recent)

    def pin(self, name: str | None) -> None:
        """Hold a slot for one more running request under `name`, loading it there first."""
        if name is None:
            return
        if name not in self.recent:
            self._load(name, self._free_slot())
        self.recent.move_to_end(name)
        self.pins[name] += 1

    def unpin(self, name: str | None) -> None:
        if name is not None and self.pins[name] > 0:
            self.pins[name] -= 1

    def slot(self, name: str | None) -> int:
        """The slot index a row under `name` reads (-1: the base)."""
        return -1 if name is None else self.slots.index(name)

    def _free_slot(self) -> int:
        if None in self.slots:
            return self.slots.index(None)
        victim = next((n for n in self.recent if not self.pins[n]), None)
        if victim is None:
            raise RuntimeError("every LoRA slot is held by running requests (can_run said so)")
        del self.recent[victim]
        self.evictions += 1
        return self.slots.index(victim)

    def _load(self, name: str, slot: int) -> None:
        host = self.host.get(name)
        if host is None:  # dropped from host memory: read the files again
            host = load_host(self.specs[name], self.geometry, self.dtype)
            self._cache(name, host)
        self.host.move_to_end(name)
        for proj in PROJECTIONS:
            for layer in range(self.config.num_layers):
                self.a[proj][layer][slot].zero_()
                self.b[proj][layer][slot].zero_()
        rank = self.max_rank
        for blk in host.blocks:
            r = blk.a.shape[0]
            lo, hi = self.geometry.subs[blk.proj][blk.sub]
            a, b = self.a[blk.proj][blk.layer], self.b[blk.proj][blk.layer]
            a[slot, blk.sub * rank : blk.sub * rank + r].copy_(blk.a, non_blocking=True)
            b[slot, lo:hi, :r].copy_(blk.b, non_blocking=True)
        self.slots[slot] = name
        self.recent[name] = None
        self.loads += 1

    def _cache(self, name: str, host: HostAdapter) -> None:
        self.host[name] = host
        while len(self.host) > self.max_cpu_loras:
            self.host.popitem(last=False)

    def stats(self) -> dict[str, object]:
        return {"slots": self.max_loras, "on_device": self.on_device(),
                "in_host": list(self.host), "loads": self.loads,
                "evictions": self.evictions}  # fmt: skip


class BaseOnly:
    """The adapter interface of an engine without slots: every request is the base's."""

    max_loras = 0
    nbytes = 0

    def can_run(self, name: str | None) -> bool:
        return name is None

    def known(self, name: str) -> bool:
        return False

    def pin(self, name: str | None) -> None:
        pass

    def unpin(self, name: str | None) -> None:
        pass

    def slot(self, name: str | None) -> int:
        return -1

    def salt(self, name: str | None) -> int:
        return 0

    def on_device(self) -> list[str]:
        return []


Adapters = LoraManager | BaseOnly
