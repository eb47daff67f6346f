"""The served models in the gateway: each one's tokenizer loaded at start, and the model a
request names (its ``model``; none: the fleet's default, infra/wire/models.py), or the LoRA
adapter it names, which runs on its parent's tokenizer and queues (infra/jobs/targets.py).

A name no served model or adapter goes by is a 404 ``model_not_found`` (OpenAI's error
object), before anything is tokenised or written; a served model whose tokenizer failed to
load is a 503. Torch-free, as the rest of the gateway.
"""

from __future__ import annotations

import logging

from tide_fleet.gateway.deps import GatewayState
from tide_fleet.gateway.errors import ApiError
from tide_fleet.infra.contract.registry import model_folder
from tide_fleet.infra.jobs.openai_request import check_model
from tide_fleet.infra.jobs.submission import ModelInfo, SubmissionError
from tide_fleet.infra.jobs.targets import Target, find_target_async
from tide_fleet.infra.wire.models import ModelCatalog, ServedModel, catalog

log = logging.getLogger(__name__)


def load_models(state: GatewayState) -> None:
    """Load every served model's tokenizer and config into `state`; the default one is also
    `state.model` (`state.model_name` its served name), as in a one-model fleet."""
    cat = state.catalog = catalog(state.settings)
    state.model_name = cat.default.name
    for m in cat.models:
        try:
            state.models[m.name] = ModelInfo.load(m.path)
        except (OSError, ValueError) as e:
            folder = model_folder(m.path)
            why = f"cannot load the tokenizer of {m.path!r} from {folder}: {e}"
            state.load_errors[m.name] = why
            log.error(state.load_errors[m.name])
    state.model = state.models.get(cat.default.name)
    state.load_error = state.load_errors.get(cat.default.name)


def served_catalog(state: GatewayState) -> ModelCatalog:
    assert state.catalog is not None, "load_models runs at start-up"
    return state.catalog


def pick(state: GatewayState, requested: str | None) -> tuple[ServedModel, ModelInfo]:
    """The served model `requested` names and its loaded tokenizer; 404 or 503 else."""
    cat = served_catalog(state)
    try:
        check_model(requested, cat)
    except SubmissionError as e:
        raise ApiError(e.status, e.message, param=e.param, code=e.code) from None
    served = cat.resolve(requested)
    assert served is not None
    return served, loaded(state, served)


def loaded(state: GatewayState, served: ServedModel) -> ModelInfo:
    """The served model's tokenizer and config; 503 when they failed to load."""
    info = state.models.get(served.name)
    if info is None:
        why = state.load_errors.get(served.name, "not loaded")
        raise ApiError(503, f"tokenizer not loaded: {why}", code="model_not_loaded")
    return info


async def pick_target(state: GatewayState, requested: str | None) -> tuple[Target, ModelInfo]:
    """What `requested` names (a served model, or a LoRA adapter declared or loaded at run
    time) and the tokenizer of the model that runs it; 404 or 503 else."""
    target = await find_target_async(state.aredis, served_catalog(state), requested)
    if target is None:
        pick(state, requested)  # answers 404 model_not_found, naming what is served
    assert target is not None
    return target, loaded(state, target.served)
