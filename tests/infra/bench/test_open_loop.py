"""The benchmarks' minimal open-loop HTTP client against a real local server."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tide_fleet.infra.bench.open_loop import post_open_loop


def test_every_request_is_sent_read_and_counted_after_the_warmup():
    seen: list[tuple[str, dict, str]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the client expects

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body, self.headers.get("Authorization", "")))
            reply = b'{"ok": true}'
            self.send_response(202 if len(seen) % 4 else 429)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = asyncio.run(
            post_open_loop(url, "/v1/jobs", {"prompt": "x"}, rate=400, n=16, concurrency=2,
                           warmup=4, headers={"Authorization": "Bearer k"})
        )  # fmt: skip
    finally:
        server.shutdown()
    assert len(seen) == 20 and {s[0] for s in seen} == {"/v1/jobs"}
    assert all(s[1] == {"prompt": "x"} and s[2] == "Bearer k" for s in seen)
    assert len(result.warm_latencies) == 4 and len(result.latencies) == 16
    assert sum(result.codes.values()) == 16 and set(result.codes) <= {202, 429}
    assert result.elapsed > 0 and result.per_s(202) > 0


def test_a_list_of_bodies_is_sent_in_turn():
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    bodies = [{"model": "a"}, {"model": "b"}, {"model": "c"}]
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        asyncio.run(post_open_loop(url, "/v1/jobs", bodies, rate=400, n=9, concurrency=1))
    finally:
        server.shutdown()
    assert seen == bodies * 3  # one connection: in order
