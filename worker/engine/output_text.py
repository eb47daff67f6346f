"""The text of the engine's outputs: incremental detokenization and stop strings, one step
late where that is safe, so it runs while the device computes the next step.

On CUDA a step's forward pass is asynchronous: the host is free from the launch until the
sampler reads the tokens back. Detokenizing the previous step's tokens in that window
takes it off the device's critical path (a few microseconds a token, a large share of a
short decode step at batch 64). That is safe for a request without stop strings: its end
(EOS or a stop token id, length, a finished grammar) never depends on its text, so it is
decided, and the request's blocks freed, in the step that sampled the token; only the
text, and so the request's output, comes one step later. A request with stop strings is
detokenized at once: its text decides whether it runs another step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tide_fleet.infra.contract.tokenizer import Tokenizer
from tide_fleet.worker.engine.detokenizer import IncrementalDetokenizer
from tide_fleet.worker.engine.outputs import RequestOutput
from tide_fleet.worker.engine.request import Request, TokenLogprob


@dataclass
class _Sampled:
    """A sampled token whose output is not made yet."""

    request: Request
    token: int
    logprob: TokenLogprob | None
    text: bool  # a stop token id adds no text
    final: bool  # the request ended with this token (its finish reason is set)


class TextOutputs:
    def __init__(self, tokenizer: Tokenizer | None, defer: bool) -> None:
        self._decode = tokenizer.decode if tokenizer is not None else None
        self.defer = defer
        self._detoks: dict[str, IncrementalDetokenizer] = {}
        self._deferred: list[_Sampled] = []

    def add(self, request: Request) -> bool:
        """Start the request's text; its output tokens so far (a resumed request) count as
        text already handed out. True when they reached a stop string."""
        if self._decode is None:
            return False
        p = request.params
        detok = IncrementalDetokenizer(self._decode, request.prompt_token_ids, p.stop, p.min_tokens)
        self._detoks[request.request_id] = detok
        kept = request.output_token_ids
        for token in kept[:-1] if kept and kept[-1] in request.stop_token_ids else kept:
            detok.add_token(token)  # a stop token adds no text
        detok.take_delta(final=False)
        return detok.stopped

    def deferrable(self, request: Request) -> bool:
        return self.defer and not request.params.stop

    @property
    def has_deferred(self) -> bool:
        return bool(self._deferred)

    def is_deferred(self, request_id: str) -> bool:
        return any(s.request.request_id == request_id for s in self._deferred)

    def stopped_by_text(self, request: Request, token: int) -> bool:
        """Now (a request that is not deferred): add the token's text; True when that
        text reached a stop string."""
        detok = self._detoks.get(request.request_id)
        if detok is None:
            return False
        detok.add_token(token)
        return detok.stopped

    def delta(self, request: Request, token: int, logprob: TokenLogprob | None) -> RequestOutput:
        """The output of a token whose text was added, the request still running."""
        detok = self._detoks.get(request.request_id)
        text = detok.take_delta(final=False) if detok is not None else ""
        return RequestOutput(request.request_id, [token], text, new_logprobs=_listed(logprob))

    def final(self, request: Request) -> RequestOutput:
        """The last output of a request that has ended (its finish reason set)."""
        detok = self._detoks.pop(request.request_id, None)
        delta = ""
        if detok is not None:
            if request.finish_reason != "error":
                detok.flush()
            delta = detok.take_delta(final=True)
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=[],
            delta_text=delta,
            finished=True,
            finish_reason=request.finish_reason,
            error=request.error,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=request.output_token_ids,
            text=detok.text if detok else "",
            timings=request.timings,
            logprobs=request.output_logprobs if request.params.logprobs is not None else None,
        )

    def defer_token(
        self, request: Request, token: int, logprob: TokenLogprob | None, text: bool, final: bool
    ) -> None:
        self._deferred.append(_Sampled(request, token, logprob, text, final))

    def drain(self, failed: Callable[[Request, Exception], RequestOutput]) -> list[RequestOutput]:
        """The outputs of every deferred token, in the order they were sampled; a request
        whose text fails gets `failed`'s output instead (the engine ends it as an error)."""
        outputs = []
        deferred, self._deferred = self._deferred, []
        for s in deferred:
            try:
                detok = self._detoks.get(s.request.request_id)
                if detok is not None and s.text:
                    detok.add_token(s.token)
                if s.final:
                    out = self.final(s.request)
                    out.new_token_ids, out.new_logprobs = [s.token], _listed(s.logprob)
                else:
                    out = self.delta(s.request, s.token, s.logprob)
            except Exception as e:
                out = failed(s.request, e)
            outputs.append(out)
        return outputs


def _listed(logprob: TokenLogprob | None) -> list[TokenLogprob]:
    return [logprob] if logprob is not None else []
