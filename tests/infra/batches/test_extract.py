"""``tide batch docs --schema`` writes data that is JSON: an output whose number does not
fit a double (it parses to infinity) or that spells NaN/Infinity is an error row, never
``Infinity`` in the output file."""

from __future__ import annotations

import json

import pytest

from tide_fleet.infra.batches.extract import extract

SCHEMA = {"type": "object", "properties": {"total": {"type": "number"}}, "required": ["total"]}


def _line(text: str) -> dict:
    choice = {"message": {"content": text}, "finish_reason": "stop"}
    return {"custom_id": "doc-1", "response": {"body": {"choices": [choice]}}}


def test_a_valid_output_is_data() -> None:
    (row,) = extract([_line('{"total": 946.24}')], SCHEMA)
    assert row == {"custom_id": "doc-1", "data": {"total": 946.24}}


@pytest.mark.parametrize("text", ['{"total": 946.24e88272138989}', '{"total": -1e999}',
                                  '{"total": NaN}', '{"total": Infinity}'])  # fmt: skip
def test_a_number_json_cannot_carry_is_an_error_row(text: str) -> None:
    (row,) = extract([_line(text)], SCHEMA)
    assert "data" not in row and "total" in row["error"], row
    json.dumps(row, allow_nan=False)  # the row itself is JSON
