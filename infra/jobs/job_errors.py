"""The answer to a synchronous request whose job did not complete, by what ended it.

- 400 ``job_rejected``: a worker refused the request itself (its options, its grammar);
- 409 ``job_cancelled``: cancelled meanwhile (``DELETE /v1/jobs/{id}``, a batch cancel);
- 504 ``expired``: its deadline or ttl passed before any worker started it;
- 503 ``no_worker`` with ``Retry-After``: its record is gone: no worker could take it,
  and a retry later may find one;
- 500 ``job_failed``: a fault inside the fleet (a worker lost it too often, an engine error).
Each message names the job id, to look it up.
"""

from __future__ import annotations

from dataclasses import dataclass

REJECTED_PREFIX = "rejected by the worker"  # worker/service.py: the request itself was bad
RETRY_AFTER_SECONDS = "5"


@dataclass
class JobErrorAnswer:
    status: int
    message: str
    code: str
    headers: dict[str, str] | None = None


def unfinished_job(job_id: str, record: dict[str, str] | None) -> JobErrorAnswer:
    status = (record or {}).get("status") or "missing"
    error = (record or {}).get("error") or ""
    if status == "cancelled":
        return JobErrorAnswer(409, f"job {job_id} was cancelled before it completed",
                              "job_cancelled")  # fmt: skip
    if status == "expired":
        return JobErrorAnswer(504, f"job {job_id} expired: {error or 'not started in time'}",
                              "expired")  # fmt: skip
    if status == "missing":
        return JobErrorAnswer(
            503, f"job {job_id} is gone: no worker could take it; retry later", "no_worker",
            {"Retry-After": RETRY_AFTER_SECONDS},
        )  # fmt: skip
    if status == "failed" and error.startswith(REJECTED_PREFIX):
        return JobErrorAnswer(400, f"job {job_id} failed: {error}", "job_rejected")
    detail = f": {error}" if error else ""
    return JobErrorAnswer(500, f"job {job_id} {status}{detail}", "job_failed")
