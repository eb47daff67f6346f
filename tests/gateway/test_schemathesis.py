"""schemathesis against the gateway's own OpenAPI schema: no 5xx, no schema violations."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from tide_fleet.gateway.app import create_app, load_state
from tide_fleet.infra.settings import Settings


@pytest.fixture
def api_schema(redis_server, tiny_path, tmp_path):
    config = Settings(
        redis_url=redis_server.url, model=str(tiny_path), api_keys={"key-s": "tenant-s"},
        webhook_allow_hosts=["127.0.0.1"], data_dir=tmp_path,  # uploads: not in the checkout
    )  # fmt: skip
    app = create_app(config)
    app.state.tide = load_state(config)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    # These wait for a worker to finish the job; no worker runs in this test.
    return schema.exclude(path_regex=r"^/v1/(completions|chat/completions|jobs/\{job_id\}/events)$")


def test_gateway_conforms_to_its_schema(api_schema):
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 6
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
        def check(case):
            # Schema-valid requests may still be refused for limits the schema cannot
            # state (the model's context length, rate limits), so positive-data
            # acceptance is not checked; every other check is.
            case.call_and_validate(
                headers={"Authorization": "Bearer key-s"},
                excluded_checks=[checks.positive_data_acceptance],
            )

        check()
