"""Worker metrics: vLLM-style engine counters and latencies, plus estimated MFU and MBU.

Names mirror vLLM's (`vllm:` becomes `tide:`), labelled by model and pool (the series per
LoRA adapter: worker/adapter_metrics.py). Every engine step calls `WorkerMetrics.on_step`
(the engine's `on_step` hook); utilisation per step comes from the roofline cost model
(infra/plan/roofline.py: the model's shapes, the tokens and KV positions of the step) over
its wall time and the device's peaks (worker/device_peaks.py). docs/observability.md lists
every series.
"""

from __future__ import annotations

import logging
import math
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.exposition import start_http_server

from tide_fleet.infra.plan.roofline import DevicePeaks, ModelCost, utilisation
from tide_fleet.infra.settings import Settings
from tide_fleet.worker.adapter_metrics import AdapterMetrics
from tide_fleet.worker.device_peaks import device_peaks
from tide_fleet.worker.engine.outputs import RequestOutput, StepStats

if TYPE_CHECKING:  # annotations only: importing the engine loads torch, which this need not
    from tide_fleet.worker.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)

REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5,
                7.5, 10, 20, 40, 80, 160)  # fmt: skip
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1, 2.5, 5, 10)  # fmt: skip
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
EMA_TAU_S = 5.0  # the utilisation EMA forgets over about this much busy (stepping) time


def ema(previous: float | None, value: float, dt: float, tau: float = EMA_TAU_S) -> float:
    """Exponential moving average weighted by time: a long step counts more than a short one."""
    if previous is None:
        return value
    alpha = 1.0 - math.exp(-dt / tau)
    return previous + alpha * (value - previous)


def model_label(name: str) -> str:
    """`dummy:tiny` stays; a folder path becomes its last part (labels stay short)."""
    return name if ":" in name and not name.startswith("/") else Path(name).name or name


# -- the registry ------------------------------------------------------------------------------


class WorkerMetrics:
    """One worker's Prometheus registry; `attach` it to an engine and every step updates it."""

    def __init__(
        self,
        cost: ModelCost,
        peaks: DevicePeaks,
        model: str,
        pool: str,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.cost, self.peaks = cost, peaks
        self.registry = registry or CollectorRegistry()
        self._created: dict[str, float] = {}  # request id -> job created_at (queue time base)
        self._last_token: dict[str, float] = {}
        self._totals: dict[str, int] = {}
        self._mfu_ema: float | None = None
        self._mbu_ema: float | None = None
        self._engine: LLMEngine | None = None
        self._server: Any = None
        labels = {"model": model, "pool": pool}  # the label as given (for_engine's choice)
        r, names = self.registry, list(labels)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(f"tide:{name}", doc, names, registry=r).labels(**labels)

        def counter(name: str, doc: str) -> Any:
            return Counter(f"tide:{name}", doc, names, registry=r).labels(**labels)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(f"tide:{name}", doc, names, registry=r, buckets=buckets).labels(
                **labels
            )

        self.running = gauge("num_requests_running", "requests in the engine's running set")
        self.waiting = gauge("num_requests_waiting", "requests admitted but not yet scheduled")
        self.kv_usage = gauge("kv_cache_usage_perc", "fraction of KV blocks in use (0-1)")
        self.max_num_seqs = gauge("engine_max_num_seqs", "the engine's sequence slots")
        self.max_batched = gauge("engine_max_num_batched_tokens", "the engine's step budget")
        self.kv_capacity = gauge("kv_cache_capacity_tokens", "tokens the KV pool holds")
        self.counters = {
            "prefix_cache_queries": counter("prefix_cache_queries", "prompt tokens looked up"),
            "prefix_cache_hits": counter("prefix_cache_hits", "prompt tokens found cached"),
            "num_preemptions": counter("num_preemptions", "requests preempted (recomputed)"),
            "prompt_tokens": counter("prompt_tokens", "prompt tokens computed (prefill)"),
            "generation_tokens": counter("generation_tokens", "tokens generated"),
        }
        self.ttft = histogram("time_to_first_token_seconds", "engine arrival to first token",
                              TTFT_BUCKETS)  # fmt: skip
        self.itl = histogram("inter_token_latency_seconds", "between two tokens", ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "job created to finished",
                             REQUEST_BUCKETS)  # fmt: skip
        self.queue_time = histogram("request_queue_time_seconds", "job created to first step",
                                    REQUEST_BUCKETS)  # fmt: skip
        self.prefill_time = histogram("request_prefill_time_seconds",
                                      "first step to first token", REQUEST_BUCKETS)  # fmt: skip
        self.decode_time = histogram("request_decode_time_seconds", "first token to finished",
                                     REQUEST_BUCKETS)  # fmt: skip
        self.iteration_tokens = histogram("iteration_tokens_total", "tokens per engine step",
                                          TOKEN_BUCKETS)  # fmt: skip
        self.step_time = Histogram(
            "tide:step_time_seconds", "engine step wall time by kind (decode, prefill, mixed)",
            [*names, "kind"], registry=r, buckets=STEP_BUCKETS,
        )  # fmt: skip
        self._labels = labels
        self.success = Counter("tide:request_success", "finished requests by reason",
                               [*names, "finished_reason"], registry=r)  # fmt: skip
        self.cold_start = gauge(
            "worker_cold_start_seconds",
            "this worker's start: process start to serving (worker/boot.py)",
        )
        self.mfu = gauge("mfu", "model FLOPs utilisation of the last step (estimate)")
        self.mbu = gauge("mbu", "memory-bandwidth utilisation of the last step (estimate)")
        self.mfu_avg = gauge("mfu_ema", f"MFU, moving average over ~{EMA_TAU_S:g} s of steps")
        self.mbu_avg = gauge("mbu_ema", f"MBU, moving average over ~{EMA_TAU_S:g} s of steps")
        self.flops = counter("estimated_flops", "FLOPs of all steps (estimate)")
        self.bytes = counter("estimated_bytes", "memory bytes moved by all steps (estimate)")
        gauge("device_peak_flops", f"peak FLOP/s used for MFU ({peaks.source})").set(peaks.flops)
        gauge("device_peak_bandwidth_bytes", f"peak bytes/s used for MBU ({peaks.source})").set(
            peaks.bandwidth
        )
        self.adapters = AdapterMetrics(r, labels)  # per LoRA adapter (adapter_metrics.py)
        ProcessCollector(registry=r)

    @classmethod
    def for_engine(
        cls, engine: LLMEngine, pool: str, settings: Settings | None = None, served: str = ""
    ) -> WorkerMetrics:
        """`served`: the model's served name, its `model` label as the gateway's and the
        controller's (none: the weights' short name)."""
        model = engine.model
        dtype = str(model.dtype).removeprefix("torch.")
        cost = ModelCost.from_config(model.config, model.dtype.itemsize)
        peaks = device_peaks(str(model.device), dtype, settings)
        metrics = cls(cost, peaks, served or model_label(engine.model_name), pool)
        metrics.attach(engine)
        return metrics

    def attach(self, engine: LLMEngine) -> None:
        self._engine = engine
        engine.on_step = self.on_step
        self.max_num_seqs.set(engine.config.max_num_seqs)
        self.max_batched.set(engine.config.max_num_batched_tokens)
        self.kv_capacity.set(engine.kv_capacity_tokens)
        stats = engine.stats()
        self._totals = {key: stats[key] for key in self.counters}  # count from now on
        self.sync(stats)

    # -- observations ----------------------------------------------------------------------

    def track(self, request_id: str, created_at: float | None, adapter: str | None = None) -> None:
        """Remember when a job was created, so queue time and e2e include its wait in Redis,
        and the LoRA adapter it runs on (None: the base model)."""
        if created_at:
            self._created[request_id] = created_at
        self.adapters.track(request_id, adapter)

    def on_step(self, step: StepStats | None, outputs: list[RequestOutput]) -> None:
        if step is not None:
            self.observe_step(step)
        self.observe_outputs(outputs, time.time())
        if self._engine is not None:
            self.sync(self._engine.stats())

    def observe_step(self, step: StepStats) -> None:
        self.step_time.labels(**self._labels, kind=step.kind).observe(step.duration_s)
        self.iteration_tokens.observe(step.num_tokens)
        flops = self.cost.flops(step.num_tokens, step.num_sampled, step.attn_context_sum)
        nbytes = self.cost.bytes_moved(step.kv_tokens_read, step.num_tokens)
        self.flops.inc(flops)
        self.bytes.inc(nbytes)
        mfu, mbu = utilisation(flops, nbytes, step.duration_s, self.peaks)
        self._mfu_ema = ema(self._mfu_ema, mfu, step.duration_s)
        self._mbu_ema = ema(self._mbu_ema, mbu, step.duration_s)
        self.mfu.set(mfu)
        self.mbu.set(mbu)
        self.mfu_avg.set(self._mfu_ema)
        self.mbu_avg.set(self._mbu_ema)

    def observe_outputs(self, outputs: list[RequestOutput], now: float) -> None:
        self.adapters.observe(outputs)
        for out in outputs:
            rid = out.request_id
            if out.new_token_ids:
                last = self._last_token.get(rid)
                if last is not None:
                    self.itl.observe(now - last)
                self._last_token[rid] = now
            if out.finished:
                self._last_token.pop(rid, None)
                created = self._created.pop(rid, None)
                reason = out.finish_reason or "stop"
                self.success.labels(**self._labels, finished_reason=reason).inc()
                if reason in ("stop", "length") and out.timings is not None:
                    self._observe_request(out.timings, created)

    def _observe_request(self, t: Any, created: float | None) -> None:
        if t.first_scheduled is None or t.first_token is None or t.finished is None:
            return
        start = min(created or t.arrival, t.arrival)
        self.queue_time.observe(max(0.0, t.first_scheduled - start))
        self.ttft.observe(max(0.0, t.first_token - t.arrival))
        self.prefill_time.observe(max(0.0, t.first_token - t.first_scheduled))
        self.decode_time.observe(max(0.0, t.finished - t.first_token))
        self.e2e.observe(max(0.0, t.finished - start))

    def sync(self, stats: dict[str, Any]) -> None:
        """Copy the engine's gauges; turn its running totals into counter increments."""
        self.running.set(stats["num_running"])
        self.waiting.set(stats["num_waiting"])
        self.kv_usage.set(stats["kv_cache_usage"])
        for key, child in self.counters.items():
            delta = stats[key] - self._totals.get(key, 0)
            if delta > 0:
                child.inc(delta)
            self._totals[key] = stats[key]
        self.adapters.sync(stats.get("lora"))

    # -- serving ----------------------------------------------------------------------------

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start the HTTP endpoint in a thread; the URL others can scrape (port 0: a free one)."""
        try:
            self._server, _ = start_http_server(port, host, self.registry)
        except OSError as e:
            raise OSError(
                f"worker_metrics_port: cannot serve metrics on {host}:{port} ({e}); "
                "use 0 for a free port"
            ) from e
        bound = self._server.server_port
        shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
        if ":" in shown:
            shown = f"[{shown}]"
        return f"http://{shown}:{bound}/metrics"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
