"""How `tide up` and `tide controller` hand settings on: to children in an explicit env, to
their own threads through `use_settings`, to Celery through `use_broker`; and the settings
that replaced direct environment reads (the env names did not change)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tide_fleet.infra.settings import Settings, child_env, get_settings, use_settings


@pytest.fixture
def restore_settings():  # type: ignore[no-untyped-def]
    yield
    use_settings(None)


def test_child_env_carries_the_fleet_and_the_rest_of_the_environment(monkeypatch):
    monkeypatch.setenv("SOMETHING_ELSE", "kept")
    monkeypatch.delenv("REDIS_URL", raising=False)
    s = Settings(model="dummy:small", data_dir="/tmp/fleet", redis_url="redis://h:1/0")
    env = child_env(s)
    assert env["SOMETHING_ELSE"] == "kept"
    assert env["TIDE_MODEL"] == "dummy:small" and env["TIDE_DATA_DIR"] == "/tmp/fleet"
    assert env["REDIS_URL"] == "redis://h:1/0"
    for name in ("TIDE_MODEL", "TIDE_DATA_DIR", "REDIS_URL"):  # a child reads the same fleet
        monkeypatch.setenv(name, env[name])
    again = Settings()
    assert (again.model, again.data_dir, again.redis_url) == (s.model, s.data_dir, s.redis_url)


def test_child_env_without_redis_leaves_redis_url_alone(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert "REDIS_URL" not in child_env(Settings(redis_url=None))


def test_use_settings_is_what_get_settings_returns(restore_settings):
    chosen = Settings(redis_url="redis://chosen:1/0")
    use_settings(chosen)
    assert get_settings() is chosen


def test_use_broker_points_the_celery_app_at_the_url():
    from tide_fleet.infra.jobs.celery_app import celery_app, use_broker

    before = celery_app.conf.broker_url
    try:
        use_broker("redis://broker:2/0")
        assert celery_app.conf.broker_url == "redis://broker:2/0"
    finally:
        use_broker(before)


def test_cache_settings_keep_their_env_names(monkeypatch, tmp_path):
    monkeypatch.setenv("TIDE_CACHE_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("TIDE_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setenv("TIDE_CPU_KERNELS", "0")
    s = Settings()
    assert s.cache_dir == tmp_path / "models" and s.kernel_cache == tmp_path / "kernels"
    assert s.cpu_kernels is False


@pytest.mark.parametrize("value", ["1", "", "false", "yes"])
def test_only_zero_turns_the_cpu_kernels_off(monkeypatch, value):
    monkeypatch.setenv("TIDE_CPU_KERNELS", value)  # as before: any other value leaves them on
    assert Settings().cpu_kernels is True


def test_empty_cache_paths_mean_the_defaults(monkeypatch):
    monkeypatch.setenv("TIDE_CACHE_DIR", "")
    monkeypatch.setenv("TIDE_KERNEL_CACHE", "")
    s = Settings()
    assert s.cache_dir == Path.home() / ".cache" / "tide"
    assert s.kernel_cache == Path.home() / ".cache" / "tide" / "kernels"


def test_registry_and_kernels_read_the_process_settings(restore_settings, tmp_path):
    from tide_fleet.infra.contract.registry import model_folder
    from tide_fleet.kernels import cpu

    use_settings(Settings(cache_dir=tmp_path / "c", kernel_cache=tmp_path / "k"))
    assert model_folder("dummy:tiny").parent == tmp_path / "c" / "dummy"
    assert cpu.cache_root() == tmp_path / "k"
