"""The test webhook receiver counts a request only when its whole body arrived: a sender
killed with -9 between the headers and the body (the chaos test kills Celery) is no
delivery, as for any real HTTP server."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import httpx

from tests.conftest import wait_for
from tests.service.conftest import Receiver


def test_a_request_cut_before_its_body_is_not_a_delivery():
    receiver = Receiver()
    try:
        parts = urlsplit(receiver.url)
        with socket.create_connection((parts.hostname, parts.port)) as sock:
            sock.sendall(b'POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n{"id":')
        wait_for(lambda: receiver.truncated == 1, 5, what="the cut request")
        assert receiver.calls == []
        httpx.post(receiver.url, content=b'{"id": "job_1"}', timeout=5)
        assert [body for _, body in receiver.calls] == [b'{"id": "job_1"}']
    finally:
        receiver.close()
