"""The LoRA adapters as `tide doctor` sees them: each one's queued jobs and the workers that
hold it (by their heartbeats: in host memory or in a device slot).

An adapter's jobs wait in its parent model's queues and count in that model's backlog, so
the queue and worker rules judge them with the parent's; this view says which adapters
the waiting work is for and where each one is loaded already. Pure and torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tide_fleet.infra.doctor.snapshot import Snapshot


@dataclass
class AdapterView:
    name: str
    queued: int = 0
    held_by: list[str] = field(default_factory=list)  # worker ids, sorted
    on_device_in: list[str] = field(default_factory=list)  # those with it in a device slot

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        held = ", ".join(f"{w} (on device)" if w in self.on_device_in else w for w in self.held_by)
        return f"{self.name}: {self.queued} queued; held by {held or 'no worker'}"


def adapter_views(snap: Snapshot) -> list[AdapterView]:
    """Every adapter with queued jobs or held by a live worker, by name."""
    views: dict[str, AdapterView] = {
        name: AdapterView(name, queued=n) for name, n in snap.adapter_queue.items() if n > 0
    }
    for worker_id, beat in sorted(snap.worker_info.items()):
        for name in beat.adapters:
            view = views.setdefault(name, AdapterView(name))
            view.held_by.append(worker_id)
            if name in beat.adapters_on_device:
                view.on_device_in.append(worker_id)
    return [views[n] for n in sorted(views)]


def render_adapters(snap: Snapshot) -> list[str]:
    """The report's adapter lines (none for a fleet serving no adapters)."""
    views = adapter_views(snap)
    return ["", "adapters:", *(f"  {v.line()}" for v in views)] if views else []
