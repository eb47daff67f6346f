"""vLLM's `POST /tokenize` and `POST /detokenize`, with the model's own tokenizer.

`/tokenize` takes a `prompt` (special tokens added by default) or `messages` (rendered with
the chat template, which writes its own special tokens: none added by default) and answers
``{count, max_model_len, tokens}``; `/detokenize` takes `tokens` and answers ``{prompt}``.
Same auth as the /v1 routes; large texts are tokenised in the tokenize thread pool.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tide_fleet.gateway.deps import GatewayState, StateDep, TenantDep
from tide_fleet.gateway.routes.jobs import ERRORS
from tide_fleet.gateway.served import pick_target
from tide_fleet.gateway.submit import INLINE_MAX_CHARS, http_error
from tide_fleet.infra.jobs.errors import SubmissionError
from tide_fleet.infra.jobs.fields import NonEmptyText, Text
from tide_fleet.infra.jobs.messages import ChatMessage
from tide_fleet.infra.jobs.request_checks import check_token_ids
from tide_fleet.infra.jobs.submission import ModelInfo, render_chat

router = APIRouter(tags=["tokenize"])


class TokenizeCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]},
    )
    model: Text | None = None
    prompt: NonEmptyText | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = Field(
        None, strict=True, description="default: true for a prompt, false for messages"
    )

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeCreate:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class DetokenizeCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: Text | None = None
    tokens: list[Annotated[int, Field(ge=0, strict=True)]] = Field(description="token ids")


async def _model(state: GatewayState, requested: str | None) -> ModelInfo:
    # The model it names (an adapter: its parent's tokenizer); 404 model_not_found else.
    return (await pick_target(state, requested))[1]


def _tokenize(model: ModelInfo, body: TokenizeCreate) -> list[int]:
    if body.messages is not None:
        text = render_chat(model, body.messages)
        special = bool(body.add_special_tokens)
    else:
        text = body.prompt or ""
        special = body.add_special_tokens is not False
    return model.encode(text, add_special_tokens=special)


@router.post("/tokenize", responses=ERRORS)
async def tokenize(body: TokenizeCreate, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    model = await _model(state, body.model)
    chars = len(body.prompt or "") + sum(len(m.content or "") for m in body.messages or [])
    try:
        if chars <= INLINE_MAX_CHARS:
            ids = _tokenize(model, body)
        else:
            ids = await anyio.to_thread.run_sync(
                _tokenize, model, body, limiter=state.tokenize_limiter
            )
    except SubmissionError as e:
        raise http_error(e) from None
    return {"count": len(ids), "max_model_len": model.config.max_model_len, "tokens": ids}


@router.post("/detokenize", responses=ERRORS)
async def detokenize(body: DetokenizeCreate, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    model = await _model(state, body.model)
    try:
        check_token_ids(body.tokens, model.tokenizer.vocab_size, "tokens")
    except SubmissionError as e:
        raise http_error(e) from None
    return {"prompt": model.tokenizer.decode(body.tokens)}
