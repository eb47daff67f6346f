"""One large request cannot starve the others: short completions flow from three clients
while a request of 4 prompts x n=4 (twice the sequence slots of the fleet's two workers)
runs.
Its jobs share the engine's slots fairly with the short ones, so the short jobs' p99
stays within 3x of their p99 without it (in one of up to three paired rounds)."""

from __future__ import annotations

import statistics
import threading
import time

import httpx

from tests.service.conftest import AUTH

SHORT = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}
BIG = {"prompt": ["Once upon a time", "The little dog", "A bird", "Tom"], "n": 4, "max_tokens": 300,
       "temperature": 1.0, "seed": 1}  # fmt: skip
CLIENTS = 3


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def short_latencies(url: str, stop: threading.Event, model: str) -> list[float]:
    """Each of CLIENTS clients sends short completions back to back until `stop`."""
    out: list[float] = []

    def client() -> None:
        with httpx.Client(base_url=url, headers=AUTH, timeout=120) as c:
            while not stop.is_set():
                t = time.perf_counter()
                r = c.post("/v1/completions", json={**SHORT, "model": model})
                assert r.status_code == 200, r.text
                out.append(time.perf_counter() - t)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def measure(url: str, model: str) -> tuple[float, float, float]:
    """Short p99 alone, short p99 during the large request, and the large request's seconds."""
    stop = threading.Event()
    timer = threading.Timer(4.0, stop.set)
    timer.start()
    alone = short_latencies(url, stop, model)

    big: dict = {}

    def run_big() -> None:
        t = time.perf_counter()
        with httpx.Client(base_url=url, headers=AUTH, timeout=300) as c:
            big["r"] = c.post("/v1/completions", json={**BIG, "model": model})
        big["seconds"] = time.perf_counter() - t

    big_thread = threading.Thread(target=run_big)
    big_thread.start()
    time.sleep(0.5)  # its sequences hold every slot before the short jobs come
    stop = threading.Event()
    watcher = threading.Thread(target=lambda: (big_thread.join(), stop.set()))
    watcher.start()
    during = short_latencies(url, stop, model)
    watcher.join()

    r = big["r"]
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 16 and all(c["text"] for c in choices)
    assert len(alone) >= 20 and len(during) >= 20, (len(alone), len(during), big)
    base, loaded = p99(alone), p99(during)
    print(f"short p99 alone {base:.3f} s ({len(alone)}), during the large request "
          f"{loaded:.3f} s ({len(during)}); it took {big['seconds']:.1f} s")  # fmt: skip
    return base, loaded, big["seconds"]


def test_a_large_request_does_not_starve_short_ones(fleet, api):
    """A p99 of a few dozen samples is nearly their maximum, so one scheduling hiccup of
    a shared 2-core machine can break the bound once; starving breaks it every time (the
    short jobs then wait seconds for the large request). Up to three paired rounds."""
    model = api.get("/v1/models").json()["data"][0]["id"]
    rounds = []
    for _ in range(3):
        base, loaded, seconds = measure(fleet.url, model)
        rounds.append((round(base, 3), round(loaded, 3), round(seconds, 1)))
        if loaded <= 3 * base:
            break
    assert loaded <= 3 * base, rounds
