"""Incremental detokenization with stop strings.

Each new token yields a text delta; the deltas concatenate to exactly the final text.
A window of a few previous tokens is decoded with the new one so that tokenizers that
treat the start of a string specially (a stripped leading space, byte-fallback pieces
of one character) produce the same text as a full decode. Text that ends in an
incomplete UTF-8 character waits for the next token; text that could still turn into
a stop string is held back until it cannot. Stop strings are looked for only from the
token after ``min_tokens`` on (as vLLM does), and then in the new text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

CONTEXT_TOKENS = 6
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(
        self,
        decode: Callable[[list[int]], str],
        prompt_token_ids: Sequence[int],
        stop: Sequence[str] = (),
        min_tokens: int = 0,
    ) -> None:
        self._decode = decode
        self._tokens = list(prompt_token_ids[-CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)
        self._stop = list(stop)
        self._holdback = max((len(s) for s in self._stop), default=1) - 1
        self.text = ""
        self._num_emitted = 0
        self._min_tokens = min_tokens
        self._num_added = 0
        self.stopped = False

    def add_token(self, token_id: int) -> None:
        """Decode one more token; sets ``stopped`` when the text reaches a stop string."""
        if self.stopped:
            return
        self._tokens.append(token_id)
        self._num_added += 1
        prefix_text = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._tokens[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):
            self._append(new_text[len(prefix_text) :])
            self._prefix_offset, self._read_offset = self._read_offset, len(self._tokens)

    def flush(self) -> None:
        """At the end: whatever is still pending (an incomplete character) is final."""
        if self.stopped:
            return
        prefix_text = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._tokens[self._prefix_offset :])
        self._append(new_text[len(prefix_text) :])
        self._prefix_offset = self._read_offset = len(self._tokens)

    def take_delta(self, final: bool) -> str:
        """Text not yet handed out; mid-stream it keeps back a possible stop-string prefix."""
        end = len(self.text) if final or self.stopped else len(self.text) - self._holdback
        if end <= self._num_emitted:
            return ""
        delta = self.text[self._num_emitted : end]
        self._num_emitted = end
        return delta

    def _append(self, delta: str) -> None:
        if not delta:
            return
        start = max(0, len(self.text) - self._holdback)
        self.text += delta
        if self._num_added <= self._min_tokens:
            return
        best = -1
        for stop in self._stop:
            i = self.text.find(stop, start)
            if i != -1 and (best == -1 or i < best):
                best = i
        if best != -1:
            self.text = self.text[:best]
            self.stopped = True
