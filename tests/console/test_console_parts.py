"""The console's small parts: engine figures from a worker's Prometheus text, arrival
rates from the backlog counters."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from pytest import approx

from tide_fleet.gateway.console.rates import ArrivalRates
from tide_fleet.gateway.console.worker_stats import EngineStats, WorkerScraper, parse_metrics


def _metrics_text() -> bytes:
    r = CollectorRegistry()
    labels = {"model": "m", "pool": "p"}

    def gauge(name, value):
        Gauge(f"tide:{name}", "", list(labels), registry=r).labels(**labels).set(value)

    def counter(name, value):
        Counter(f"tide:{name}", "", list(labels), registry=r).labels(**labels).inc(value)

    gauge("kv_cache_usage_perc", 0.25)
    gauge("kv_cache_capacity_tokens", 4096)
    gauge("mfu_ema", 0.12)
    gauge("mbu_ema", 0.5)
    counter("prefix_cache_queries", 200)
    counter("prefix_cache_hits", 50)
    return generate_latest(r)


def test_engine_figures_from_a_workers_metrics():
    stats = parse_metrics(_metrics_text().decode())
    assert (stats.kv_used_tokens, stats.kv_capacity_tokens) == (1024, 4096)
    assert (stats.mfu, stats.mbu, stats.prefix_hit_rate) == (0.12, 0.5, 0.25)
    odd = 'tide:mfu_ema{model="a b}c",pool="p"} 0.5 1700000000000\n# tide:mbu_ema 9\n'
    assert parse_metrics(odd).mfu == 0.5 and parse_metrics(odd).mbu is None
    empty = parse_metrics("")
    assert empty.prefix_hit_rate is None and empty.kv_used_tokens is None


def test_arrival_rates_over_a_window():
    rates = ArrivalRates()
    short = ("m", "short")
    assert rates.update(100.0, short, 10, 1000) is None  # one reading: no rate yet
    assert rates.update(101.0, short, 12, 1200) is None  # under the minimum span
    assert rates.update(104.0, short, 18, 1800) == (2.0, 200.0)
    assert rates.update(104.1, short, 19, 1900) == approx((9 / 4.1, 900 / 4.1))  # no new point
    # Past the window the oldest points go: the rate is over the last 96 s, not 100.
    assert rates.update(200.0, short, 30, 3000) == approx((12 / 96, 1200 / 96))
    assert rates.update(203.0, short, 5, 500) is None  # counters reset: start again


def test_each_models_bucket_has_its_own_rate():
    rates = ArrivalRates()
    assert rates.update(100.0, ("a", "short"), 0, 0) is None
    assert rates.update(100.0, ("b", "short"), 50, 5000) is None  # not a reset of a's
    assert rates.update(104.0, ("a", "short"), 8, 800) == (2.0, 200.0)
    assert rates.update(104.0, ("b", "short"), 50, 5000) == (0.0, 0.0)


def test_the_scraper_answers_at_once_and_refreshes_in_the_background():
    text = _metrics_text()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 500)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    good = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    bad = f"http://127.0.0.1:{server.server_address[1]}/broken"

    async def go() -> None:
        scraper = WorkerScraper()
        first = scraper.stats([good, bad])
        assert first == {good: EngineStats(), bad: EngineStats()}  # not known yet: no wait
        await scraper.settle()
        known = scraper.stats([good, bad])
        assert known[good].kv_capacity_tokens == 4096 and known[bad] == EngineStats()
        assert scraper.stats([bad]) == {bad: EngineStats()}  # the good one left the fleet...
        assert scraper.stats([good]) == {good: EngineStats()}  # ...and was forgotten
        await scraper.settle()

    try:
        asyncio.run(go())
    finally:
        server.shutdown()
