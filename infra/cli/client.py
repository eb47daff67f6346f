"""``tide submit`` and ``tide status``: a job through a running gateway."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sm = sub.add_parser("submit", help="submit a job to a running gateway")
    sm.add_argument("text")
    sm.add_argument("--max-tokens", type=int, default=64)
    sm.add_argument("--temperature", type=float, default=0.0)
    sm.add_argument("--wait", action="store_true", help="poll until the job ends; print its text")
    client_flags(sm)
    sm.set_defaults(func=cmd_submit)

    st = sub.add_parser("status", help="show a job")
    st.add_argument("job_id")
    client_flags(st)
    st.set_defaults(func=cmd_status)


def client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=DEFAULT_URL, help="gateway base URL")
    p.add_argument("--api-key", default=None, help="bearer key (when the gateway requires one)")


@contextlib.contextmanager
def gateway_client(url: str, api_key: str | None, timeout: float = 30) -> Iterator[httpx.Client]:
    """A client for the gateway at `url` (--url): a gateway it cannot reach, or an error
    status raised in the block (``raise_for_status``), ends the command with one line on
    stderr (the URL it tried, how to choose another), exit status 2."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=timeout) as c:
            yield c
    except (httpx.TransportError, httpx.InvalidURL, httpx.UnsupportedProtocol) as e:
        chosen = "the default" if url == DEFAULT_URL else f"from --url; default {DEFAULT_URL}"
        reason = " ".join(str(e).split()).rstrip(".") or type(e).__name__
        print(
            f"error: cannot reach the gateway at {url} ({chosen}): {reason}; start "
            "one (tide up) or pass --url URL",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    except httpx.HTTPStatusError as e:
        r = e.response
        detail = " ".join(r.text.split())[:500]
        print(
            f"error: the gateway at {url} answered {r.status_code} to {r.request.method} "
            f"{r.request.url.path}: {detail}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


def cmd_submit(args: argparse.Namespace) -> int:
    with gateway_client(args.url, args.api_key) as client:
        body = {"prompt": args.text, "max_tokens": args.max_tokens, "temperature": args.temperature}
        r = client.post("/v1/jobs", json=body)
        if r.status_code != 202:
            print(f"error: {r.status_code} {r.text}", file=sys.stderr)
            return 1
        job = r.json()
        if not args.wait:
            print(json.dumps(job))
            return 0
        while True:
            job = client.get(f"/v1/jobs/{job['id']}").json()
            if job["status"] not in ("queued", "in_progress"):
                break
            time.sleep(0.1)
        print(json.dumps(job, indent=2))
        return 0 if job["status"] == "completed" else 1


def cmd_status(args: argparse.Namespace) -> int:
    with gateway_client(args.url, args.api_key) as client:
        r = client.get(f"/v1/jobs/{args.job_id}")
    if r.status_code != 200:
        print(f"error: {r.status_code} {r.text}", file=sys.stderr)
        return 1
    print(json.dumps(r.json(), indent=2))
    return 0
