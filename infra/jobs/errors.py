"""A refused request, as the request-building code raises it (the gateway answers it as
the error object; the batch fan-out writes it as the line's error)."""

from __future__ import annotations


class SubmissionError(Exception):
    """A refused request: its HTTP status, a message naming the field and the limit, the
    field (`param`) and a short machine-readable code."""

    def __init__(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers
        self.param, self.code = param, code


def bad_request(param: str, message: str, code: str = "invalid_value") -> SubmissionError:
    """A 400 whose message starts with the field, as the validation errors' do."""
    return SubmissionError(400, f"{param}: {message}", param=param, code=code)
