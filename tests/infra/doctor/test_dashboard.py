"""The Grafana dashboard only queries series that Tide's registries really expose."""

from __future__ import annotations

import json
import re

from prometheus_client import CollectorRegistry

from tests.conftest import ROOT
from tide_fleet.infra.plan.roofline import DevicePeaks, ModelCost
from tide_fleet.worker.metrics import WorkerMetrics

DASHBOARD = ROOT / "infra/grafana/tide-dashboard.json"
NAME = re.compile(r"(?<![\w:])((?:tide:|process_)[A-Za-z0-9_:]+)")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",),
            "unknown": ("",), "info": ("_info",), "summary": ("_sum", "_count", "")}  # fmt: skip


def exposed(registry: CollectorRegistry) -> set[str]:
    """Every sample name a registry can expose, labelled children or not."""
    names = set()
    for family in registry.collect():
        names.update(family.name + s for s in SUFFIXES[family.type])
        names.update(s.name for s in family.samples)
    return names


def all_exposed() -> set[str]:
    from tide_fleet.gateway.metrics import registry as gateway
    from tide_fleet.infra.contract.model_config import ModelConfig
    from tide_fleet.infra.fleet.controller_metrics import registry as controller

    cfg = ModelConfig("LlamaForCausalLM", 10, 8, 16, 2, 2, 1, 4, 64)
    worker = WorkerMetrics(ModelCost.from_config(cfg, 2), DevicePeaks(1, 1, "t"), "m", "p")
    return exposed(worker.registry) | exposed(gateway) | exposed(controller)


def queries(node: object) -> list[str]:
    if isinstance(node, dict):
        own = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return own + [q for v in node.values() for q in queries(v)]
    if isinstance(node, list):
        return [q for v in node for q in queries(v)]
    return []


def test_every_queried_series_is_exposed():
    dash = json.loads(DASHBOARD.read_text())
    exprs = queries(dash["panels"])
    used = {m for e in exprs for m in NAME.findall(e)}
    assert len(exprs) > 30 and len(used) > 30
    missing = used - all_exposed()
    assert not missing, f"the dashboard queries series nobody exposes: {sorted(missing)}"


def test_doctor_reads_only_exposed_series():
    # The modules that name series: the rules and the snapshot queries they use.
    files = ("queue_rules.py", "bottleneck_rules.py", "findings.py", "queues.py", "snapshot.py")
    source = "".join((ROOT / "infra/doctor" / f).read_text() for f in files)
    used = set(NAME.findall(source))
    assert {"tide:kv_cache_usage_perc", "process_cpu_seconds_total"} <= used
    names = all_exposed()
    missing = {m for m in used if m not in names and f"{m}_bucket" not in names}  # histograms
    assert not missing, sorted(missing)


def test_dashboard_is_importable_with_a_datasource_variable():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 30
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for topic in ("queued", "backlog", "oldest", "first token", "inter-token", "end-to-end",
                  "queue time", "kv cache", "mfu", "desired", "preemptions", "prefix",
                  "rejections"):  # fmt: skip
        assert topic in titles, topic


def test_histogram_quantiles_use_buckets():
    exprs = queries(json.loads(DASHBOARD.read_text())["panels"])
    for e in exprs:
        if "histogram_quantile" in e:
            assert "_bucket" in e and "le" in e, e
