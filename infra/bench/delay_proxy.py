"""A loopback TCP proxy that delays what a client sends: a slow or cut Redis, on demand,
for the worker's Redis benchmark (scripts/bench_worker_redis.py) and its tests."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any


class DelayProxy:
    """A loopback TCP proxy in front of a server: each chunk the client sends is held for
    `delay` seconds, in order, so every round trip takes that much longer. ``cut`` drops
    every connection with what it holds and refuses new ones until ``resume``."""

    def __init__(self, upstream_port: int, delay: float = 0.0) -> None:
        self.upstream_port = upstream_port
        self.delay = delay
        self.port = 0  # chosen at the first start, kept after a cut
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> DelayProxy:
        self._thread.start()
        self.resume()
        return self

    def resume(self) -> None:
        self._call(self._listen())

    def cut(self) -> None:
        self._call(self._cut())

    def stop(self) -> None:
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _cut(self) -> None:
        self.cuts += 1
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()

    async def _close(self) -> None:
        await self._cut()
        others = asyncio.all_tasks() - {asyncio.current_task()}
        await asyncio.wait(others, timeout=5) if others else None

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        cuts = self.cuts
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.transport.abort()
            return
        if self.cuts != cuts:  # cut while it connected
            client_w.transport.abort()
            server_w.transport.abort()
            return
        self._writers |= {client_w, server_w}
        await asyncio.gather(
            self._pipe(client_r, server_w, self.delay),
            self._pipe(server_r, client_w, 0.0),
            return_exceptions=True,
        )
        for w in (client_w, server_w):
            w.transport.abort()
            self._writers.discard(w)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float
    ) -> None:
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._send(held, writer))
        try:
            while data := await reader.read(1 << 16):
                held.put_nowait((loop.time() + delay, data))
        finally:
            held.put_nowait((0.0, b""))  # the end: what is held still goes, then close
            await sender

    async def _send(
        self, held: asyncio.Queue[tuple[float, bytes]], w: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        while (item := await held.get())[1]:
            due, data = item
            await asyncio.sleep(due - loop.time())
            if w.transport.is_closing():  # cut: what is held is lost
                continue
            w.write(data)
            with contextlib.suppress(OSError):
                await w.drain()
        w.close()
