"""The process tree below a pid, read from /proc: what `tide up` runs, found by name."""

from __future__ import annotations

import os
from pathlib import Path


def descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every live process below pid."""
    parents: dict[int, int] = {}
    cmds: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        state, ppid = stat.rsplit(") ", 1)[1].split()[:2]
        if state != "Z":
            parents[int(entry)], cmds[int(entry)] = int(ppid), cmd
    out: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        for child, parent in parents.items():
            if parent == p and child not in out:
                out[child] = cmds[child]
                frontier.append(child)
    return out


def find(pid: int, needle: str) -> int | None:
    return next((p for p, cmd in descendants(pid).items() if needle in cmd), None)
