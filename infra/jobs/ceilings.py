"""Cost ceilings: the most work one request may ask for, per tenant.

A request's work is what it may make the fleet compute: for every prompt and every choice,
its prompt plus ``max_tokens``. One job carries a prompt and its ``n`` choices; an OpenAI
request with a list of prompts is several jobs, counted together. A request over its
tenant's ceiling is refused with a 400 naming ``max_tokens`` and the limit before anything
is queued; a batch line over it fails that line with the same error.

``max_request_tokens`` is the default ceiling; ``tenant_max_request_tokens`` sets it per
tenant. The fair shares inside the worker (worker/engine/fair_share.py) keep a large
request from starving others; the ceiling bounds how large one may be at all.
"""

from __future__ import annotations

from tide_fleet.infra.jobs.errors import SubmissionError
from tide_fleet.infra.settings import Settings


def ceiling(settings: Settings, tenant: str) -> int:
    return settings.tenant_max_request_tokens.get(tenant, settings.max_request_tokens)


def check_work(
    settings: Settings, tenant: str, prompt_tokens: list[int], n: int, max_tokens: int
) -> None:
    """Raise a 400 unless len(prompt_tokens) prompts (their token counts) x n choices x
    (prompt + max_tokens) fits the tenant's ceiling."""
    work = sum(n * (p + max_tokens) for p in prompt_tokens)
    limit = ceiling(settings, tenant)
    if work <= limit:
        return
    prompts = f"{len(prompt_tokens)} prompts" if len(prompt_tokens) > 1 else "the prompt"
    raise SubmissionError(
        400,
        f"max_tokens: the request may compute {work:,} tokens ({prompts}, {sum(prompt_tokens):,} "
        f"prompt tokens, x n={n} x (prompt + max_tokens={max_tokens})), over this tenant's "
        f"ceiling of {limit:,} tokens per request (lower max_tokens or n, or split it)",
        param="max_tokens", code="request_too_large",
    )  # fmt: skip
