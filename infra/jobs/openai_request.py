"""From an OpenAI request body to the jobs that serve it, with the checks that join fields.

A completions request makes one job per prompt (each with its n choices); a chat request
makes one. Each planned job carries its job-API body, the extra record fields (what to
record: ``user``, ``safety_identifier``, ``prompt_cache_key``; how to render: ``render``)
and the tools for the chat template. Shared by the routes and the batch fan-out.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from tide_fleet.infra.contract import chat_template
from tide_fleet.infra.jobs import tools
from tide_fleet.infra.jobs.errors import SubmissionError, bad_request
from tide_fleet.infra.jobs.messages import NamedToolChoice
from tide_fleet.infra.jobs.request_checks import check_structured
from tide_fleet.infra.jobs.schemas import (
    ChatCompletionCreate,
    CompletionCreate,
    JobCreate,
    OpenAIFields,
)
from tide_fleet.infra.jobs.submission import ModelInfo
from tide_fleet.infra.jobs.targets import Target
from tide_fleet.infra.wire.models import ModelCatalog
from tide_fleet.infra.wire.protocol import Priority

MAX_CHOICES = 128  # prompts x n in one request
RECORDED = ("user", "safety_identifier", "prompt_cache_key")


@dataclass
class PlannedJob:
    body: JobCreate
    fields: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None  # OpenAI's form, for the chat template


def check_model(requested: str | None, served: str | ModelCatalog | Target) -> None:
    """404 model_not_found unless `requested` (None: the default) is a served model's name
    or alias (`served`: the catalog, or the one name a one-model fleet serves), or names the
    target the request was resolved to (`served`: a Target; an adapter's name included)."""
    if isinstance(served, Target):
        known, names = served.answers_to(requested), [served.name]
    elif isinstance(served, str):
        known, names = requested is None or requested == served, [served]
    else:
        known, names = requested is None or served.resolve(requested) is not None, served.names()
    if not known:
        listed = ", ".join(repr(n) for n in names)
        raise SubmissionError(
            404, f"model: {requested!r} is not served here; this fleet serves {listed}",
            param="model", code="model_not_found",
        )  # fmt: skip


def _common(req: OpenAIFields, served: str | ModelCatalog | Target) -> dict[str, Any]:
    """Checks every OpenAI body needs; the record fields it asks to keep."""
    check_model(req.model, served)
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options", "only with stream: true")
    spec = req.structured_spec()
    if spec is not None:
        check_structured(spec, "response_format")
    return {name: getattr(req, name) for name in RECORDED if getattr(req, name, None)}


def completion_jobs(
    req: CompletionCreate, served: str | ModelCatalog | Target, info: ModelInfo, priority: Priority
) -> list[PlannedJob]:
    recorded = _common(req, served)
    prompts = req.prompts()
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request(
            "best_of", f"only equal to n ({req.n}): Tide returns every choice it samples",
            "unsupported_value",
        )  # fmt: skip
    if req.echo and req.logprobs is not None:
        raise bad_request(
            "echo", "echo with logprobs would need the prompt's logprobs, which Tide does not "
            "compute: ask for one or the other", "unsupported_value",
        )  # fmt: skip
    if len(prompts) * req.n > MAX_CHOICES:
        raise bad_request("n", f"{len(prompts)} prompts x n={req.n} is over {MAX_CHOICES} "
                          "choices in one request", "too_many_choices")  # fmt: skip
    sampling = req.sampling()
    planned = []
    # The request's jobs share one fair-share group in the worker's engine: together they
    # get one job's share of a step, not one share per prompt.
    group = {"group": "grp_" + uuid.uuid4().hex} if len(prompts) > 1 else {}
    for prompt in prompts:
        body = JobCreate(**sampling, **req.timing(), n=req.n, prompt=prompt, priority=priority)
        fields = {**recorded, **group}
        if req.echo:
            text = prompt if isinstance(prompt, str) else info.tokenizer.decode(prompt)
            fields["render"] = {"echo": text}
        planned.append(PlannedJob(body, fields))
    return planned


def _tool_plan(req: ChatCompletionCreate, info: ModelInfo) -> tuple[Any, Any]:
    """(structured constraint or None, ToolRender or None) for the request's tools."""
    given = req.tools or []
    choice = req.tool_choice or ("auto" if given else "none")
    if not given:
        if choice != "none":
            raise bad_request("tool_choice", "needs tools")
        return None, None
    if not chat_template.supports_tools(info.tokenizer):
        raise SubmissionError(
            400, f"tools: the chat template of model {info.name!r} does not use tools, so the "
            "model cannot be shown them", param="tools", code="tools_unsupported",
        )  # fmt: skip
    names = [t.function.name for t in given]
    if len(set(names)) != len(names):
        raise bad_request("tools", "function names must be unique")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise bad_request("tool_choice", f"function {choice.function.name!r} is not in tools")
    if choice == "none":
        return None, None
    constraint = tools.constraint(given, choice)
    if constraint is not None:
        if req.response_format is not None and req.response_format.type != "text":
            raise bad_request(
                "response_format", "cannot be combined with a required tool call (the output "
                "is the call)", "unsupported_value",
            )  # fmt: skip
        check_structured(constraint, "tools")
    mode = "required" if constraint is not None else "auto"
    return constraint, tools.ToolRender(mode, names, req.parallel_tool_calls is not False)


def chat_job(
    req: ChatCompletionCreate,
    served: str | ModelCatalog | Target,
    info: ModelInfo,
    priority: Priority,
) -> PlannedJob:
    fields = _common(req, served)
    given = req.model_fields_set
    if {
        "max_tokens",
        "max_completion_tokens",
    } <= given and req.max_tokens != req.max_completion_tokens:
        raise bad_request("max_completion_tokens", f"{req.max_completion_tokens} conflicts "
                          f"with max_tokens ({req.max_tokens}): send one")  # fmt: skip
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs", "needs logprobs: true")
    constraint, render = _tool_plan(req, info)
    sampling = req.sampling()
    if constraint is not None:
        sampling["structured"] = constraint
    if render is not None:
        fields["render"] = {"tools": render.to_dict()}
    body = JobCreate(
        **sampling,
        **req.timing(),
        n=req.n,
        messages=req.messages,
        priority=priority,
        metadata=req.metadata,
    )
    template_tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    return PlannedJob(body, fields, template_tools)
