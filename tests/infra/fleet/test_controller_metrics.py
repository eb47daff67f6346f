"""The controller's metrics name the model: backlog series by (model, bucket), pool series
by (pool, model); the default model goes by its served name, never ''."""

from __future__ import annotations

from prometheus_client import generate_latest

from tests.infra.fleet.test_controller_records import FakeActuator
from tide_fleet.infra.doctor.scrape import Scrape
from tide_fleet.infra.fleet import controller_metrics
from tide_fleet.infra.fleet.controller import Controller
from tide_fleet.infra.fleet.fleet_config import parse_fleet
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.protocol import Keys, backlog_field

POOL = {"buckets": ["short", "medium", "long"], "max_workers": 2, "tokens_per_s": 100}


def scrape() -> Scrape:
    return Scrape.parse(generate_latest(controller_metrics.registry).decode())


def test_two_models_backlog_and_pools_are_labelled_by_model(redis_client, redis_server):
    pools = {"pa": POOL | {"model": "dummy:tiny", "served_name": "alpha"},
             "pb": POOL | {"model": "dummy:small", "served_name": "beta"}}  # fmt: skip
    fleet = parse_fleet({"pools": pools})
    settings = Settings(redis_url=redis_server.url, served_models=fleet.served_models("dummy:tiny"))
    controller = Controller(fleet, settings, FakeActuator(), redis_client, clock=lambda: 1000.0)
    redis_client.zadd(Keys.backlog(backlog_field("short", "beta")), {"j1": 990.0, "j2": 995.0})
    redis_client.hset(Keys.backlog_tokens, backlog_field("short", "beta"), 700)
    controller.step()
    s = scrape()
    assert s.total("tide:controller_queue_jobs", model="beta", bucket="short") == 2
    assert s.total("tide:controller_backlog_tokens", model="beta", bucket="short") == 700
    assert s.total("tide:controller_oldest_job_age_seconds", model="beta", bucket="short") == 10
    assert s.total("tide:controller_queue_jobs", model="alpha", bucket="short") == 0  # default
    assert "" not in s.by_label("tide:controller_queue_jobs", "model")
    assert s.total("tide:controller_desired_workers", pool="pb", model="beta") == 1
    assert s.total("tide:controller_desired_workers", pool="pa", model="alpha") == 0
    assert s.total("tide:controller_workers", pool="pa", model="alpha", state="ready") == 0
    assert s.total("tide:controller_arrival_tokens_per_second", pool="pb", model="beta") is not None
    assert s.total("tide:controller_service_tokens_per_second", pool="pa", model="alpha") == 100
    assert s.total("tide:controller_decisions_total", pool="pb", model="beta",
                   action="scale_out") == 1  # fmt: skip


def test_one_model_goes_by_its_served_name(redis_client, redis_server):
    fleet = parse_fleet({"pools": {"solo": POOL}})
    settings = Settings(redis_url=redis_server.url, model="dummy:tiny")
    controller = Controller(fleet, settings, FakeActuator(), redis_client, clock=lambda: 1000.0)
    controller.step()
    s = scrape()
    assert s.total("tide:controller_queue_jobs", model="dummy:tiny", bucket="long") == 0
    assert s.total("tide:controller_desired_workers", pool="solo", model="dummy:tiny") == 0
