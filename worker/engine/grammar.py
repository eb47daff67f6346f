"""Grammar state of constrained requests: one llguidance matcher each, and their token masks.

Torch-free (numpy buffers), and built without llguidance: only ``add`` needs it, and
without it refuses the request with a ValueError naming the package. A matcher is made
when its request is added: the spec is compiled once per distinct constraint and kept (a
small LRU of templates), and each request gets a deep copy of the template
(microseconds), so a batch of documents under one schema compiles it once. A matcher
advances only when the engine accepts a sampled token; a preempted request keeps its
generated tokens and so its matcher as it is, and recomputation never feeds it again.

Masks for a step are started right after scheduling. With ``overlap`` (the engine sets it
on CUDA, where the CPU idles while the GPU runs) llguidance's parallel executor (Rust,
GIL released) fills them in a background thread while the model runs. On CPU the model
already uses every core: a background thread only slows it by what the masks cost, and
handing work to the executor's pool behind torch's spinning OpenMP threads is slower
than filling each mask on the calling thread (measured: ~16 us a row inline against
30-100 us through the pool), so there they are filled inline, one matcher after another.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from tide_fleet.infra.contract.structured import (
    StructuredOutput,
    check_grammar,
    grammar_for,
    require_llguidance,
    trim_error,
)

with contextlib.suppress(ImportError):  # optional: add() refuses every request without it
    import llguidance

TEMPLATE_CACHE_SIZE = 64


@dataclass
class GrammarMasks:
    """Allowed-token bitmasks: row j (int32 words, bit i of word w = token 32w + i)
    belongs to logits row ``rows[j]``."""

    rows: list[int]
    bits: np.ndarray


@dataclass
class PendingMasks:
    """Masks being computed for ``request_ids``, in this order (``GrammarMatchers.wait``)."""

    request_ids: list[str]
    bits: np.ndarray
    future: Future[None] | None


class GrammarMatchers:
    def __init__(
        self, tokenizer_json: str, vocab_size: int, eos_token_ids: list[int] | None = None
    ) -> None:
        self._tokenizer_json = tokenizer_json
        self._vocab_size = vocab_size
        self._eos = list(eos_token_ids) if eos_token_ids else None
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._executor: llguidance.LLExecutor | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._templates: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._matchers: dict[str, llguidance.LLMatcher] = {}
        self.overlap = False
        # For measurement: compiles and their seconds; masks computed, the seconds that
        # took, and the seconds a step waited for them (what overlap did not hide).
        self.num_compiles = 0
        self.compile_seconds = 0.0
        self.num_masks = 0
        self.mask_seconds = 0.0
        self.wait_seconds = 0.0

    @property
    def num_matchers(self) -> int:
        return len(self._matchers)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._matchers

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """Built on first use (a fraction of a second for a large vocabulary)."""
        if self._tokenizer is None:
            try:
                tok = llguidance.LLTokenizer(self._tokenizer_json, eos_token=self._eos)
                if tok.vocab_size < self._vocab_size:
                    tok = llguidance.LLTokenizer(
                        self._tokenizer_json, n_vocab=self._vocab_size, eos_token=self._eos
                    )
            except Exception as e:
                raise ValueError(
                    f"structured output is not supported by this tokenizer: {e}"
                ) from e
            self._tokenizer = tok
        return self._tokenizer

    @property
    def num_words(self) -> int:
        return (self.tokenizer.vocab_size + 31) // 32

    def add(self, request_id: str, spec: StructuredOutput) -> None:
        """Give the request a matcher at the grammar's start; ValueError if it will not
        compile, or llguidance is not installed."""
        require_llguidance()
        key = spec.cache_key()
        template = self._templates.get(key)
        if template is None:
            tokenizer = self.tokenizer
            start = time.perf_counter()
            grammar = grammar_for(spec)
            template = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
            if template.is_error():
                check_grammar(spec.kind, grammar)  # the message, as validate() words it
                raise ValueError(f"{spec.kind}: {trim_error(template.get_error())}")
            self.num_compiles += 1
            self.compile_seconds += time.perf_counter() - start
            self._templates[key] = template
            if len(self._templates) > TEMPLATE_CACHE_SIZE:
                self._templates.popitem(last=False)
        else:
            self._templates.move_to_end(key)
        self._matchers[request_id] = template.deep_copy()

    def remove(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def start_masks(self, request_ids: list[str]) -> PendingMasks | None:
        """Begin computing next-token masks for those of ``request_ids`` that are
        constrained; None when none is. Their matchers must not move until ``wait``."""
        ids = [rid for rid in request_ids if rid in self._matchers]
        if not ids:
            return None
        row_bytes = self.num_words * 4
        bits = np.zeros((len(ids), self.num_words), dtype=np.int32)
        work = [(self._matchers[rid], j) for j, rid in enumerate(ids)]
        if not self.overlap:
            start = time.perf_counter()
            for matcher, j in work:
                matcher.unsafe_compute_mask_ptr(bits.ctypes.data + j * row_bytes, row_bytes)
            self._count_masks(len(ids), start)
            return PendingMasks(ids, bits, None)
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        executor = self._executor

        def fill() -> None:
            start = time.perf_counter()
            executor.unsafe_compute_mask_ptr(work, bits.ctypes.data, row_bytes, len(ids))
            self._count_masks(len(ids), start)

        assert self._pool is not None
        return PendingMasks(ids, bits, self._pool.submit(fill))

    def _count_masks(self, num: int, start: float) -> None:
        self.mask_seconds += time.perf_counter() - start
        self.num_masks += num

    def wait(self, pending: PendingMasks, sampled_ids: list[str]) -> GrammarMasks:
        """Block until the masks are ready; map them onto the logits rows of sampled_ids."""
        if pending.future is not None:
            start = time.perf_counter()
            pending.future.result()
            self.wait_seconds += time.perf_counter() - start
        where = {rid: row for row, rid in enumerate(sampled_ids)}
        return GrammarMasks([where[rid] for rid in pending.request_ids], pending.bits)

    def advance(self, request_id: str, token_ids: list[int]) -> bool:
        """Advance a new matcher over output tokens already known (a resumed request); True
        when the grammar is then complete. ValueError if it refuses one."""
        done = False
        for token in token_ids:
            done = self.accept(request_id, token)
        return done

    def accept(self, request_id: str, token_id: int) -> bool:
        """Advance the request's matcher by a sampled token; True when the grammar is then
        complete (satisfied, and admits nothing more). ValueError if it refuses the token
        (a row the masks left with no allowed token ends up here too)."""
        matcher = self._matchers[request_id]
        if not matcher.consume_token(token_id):
            raise ValueError(
                f"token {token_id} broke the grammar: {trim_error(matcher.get_error())}"
            )
        return matcher.is_stopped()
