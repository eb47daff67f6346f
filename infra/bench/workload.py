"""What ``tide bench`` sends: seeded open-loop arrivals (Poisson or gamma gaps), lognormal
length classes or a request trace, and prompt texts of an exact token count."""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass, field
from typing import Any

from tide_fleet.infra.traces import RequestRow, read_request_trace

# Plain words for synthetic prompts: common English keeps subword tokenizers near one
# token per word, and any tokenizer can cut them to an exact length.
_WORD_TEXT = (
    "the a little girl boy cat dog sun tree house ball red blue big small happy sad day "
    "night park friend mom dad play run jump see look find went said was had and then "
    "with in on under over very one time once upon bird fish water sky green box toy"
)
WORDS = tuple(_WORD_TEXT.split(" "))


@dataclass
class WorkItem:
    """One request to send ``arrival`` seconds after the start."""

    index: int
    arrival: float
    prompt: str
    max_tokens: int
    kind: str = "short"  # the length class (statistics are also reported per kind)


@dataclass(frozen=True)
class LengthClass:
    """Lognormal prompt and output lengths (medians in tokens), capped in total."""

    name: str
    share: float
    prompt_median: int
    output_median: int
    max_total: int


def arrival_offsets(n: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Start times with gamma gaps: mean 1/rate, CV 1/sqrt(burstiness); 1 is Poisson.

    rate = inf sends everything at once. The first request starts at 0.
    """
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"rate and burstiness must be positive, got {rate} and {burstiness}")
    if math.isinf(rate):
        return [0.0] * n
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return out


def draw_lengths(
    classes: list[LengthClass], sigma: float, rng: random.Random
) -> tuple[str, int, int]:
    """(class name, prompt tokens, output tokens) for one request."""
    cls = rng.choices(classes, weights=[c.share for c in classes])[0]
    prompt = _lognormal(rng, cls.prompt_median, sigma, 2, cls.max_total - 1)
    output = _lognormal(rng, cls.output_median, sigma, 1, cls.max_total - prompt)
    return cls.name, prompt, output


def _lognormal(rng: random.Random, median: int, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(rng.lognormvariate(math.log(median), sigma))))


class PromptMaker:
    """Prompt texts of a given token count for the served model's tokenizer.

    Without a tokenizer it counts one token per word, which is only an estimate.
    """

    def __init__(self, tokenizer: Any | None, rng: random.Random) -> None:
        self.tokenizer = tokenizer
        self.rng = rng
        self.num_special = (
            len(tokenizer.encode("x")) - len(tokenizer.encode("x", False)) if tokenizer else 0
        )

    def make(self, num_tokens: int, first: bool = True) -> str:
        """A text of num_tokens tokens; first=False for text that follows a prefix (no BOS)."""
        words = [self.rng.choice(WORDS) for _ in range(max(1, num_tokens))]
        if self.tokenizer is None:
            return " ".join(words)
        want = max(1, num_tokens - (self.num_special if first else 0))
        ids = self.tokenizer.encode(" ".join(words), False)
        while len(ids) < want:  # a tokenizer with fewer tokens than words (never in practice)
            words += words
            ids = self.tokenizer.encode(" ".join(words), False)
        return str(self.tokenizer.decode(ids[:want]))


@dataclass
class WorkloadSpec:
    """What to send; the same spec and seed give the same requests at the same times."""

    num_requests: int = 50
    request_rate: float = 5.0
    burstiness: float = 1.0
    seed: int = 0
    classes: list[LengthClass] = field(default_factory=list)
    sigma: float = 0.6
    shared_prefix_len: int = 0  # every prompt starts with the same text this long
    trace: list[RequestRow] | None = None


def build_workload(spec: WorkloadSpec, tokenizer: Any | None) -> list[WorkItem]:
    rng = random.Random(spec.seed)
    maker = PromptMaker(tokenizer, random.Random(spec.seed + 1))
    prefix = maker.make(spec.shared_prefix_len) + " " if spec.shared_prefix_len else ""

    def prompt(num_tokens: int) -> str:
        return prefix + maker.make(num_tokens, first=not prefix)

    if spec.trace is not None:
        rows = spec.trace[: spec.num_requests]
        times = arrival_offsets(len(rows), spec.request_rate, spec.burstiness, rng)
        if rows[0].offset is not None:
            times = [float(r.offset or 0.0) for r in rows]
        items = [
            WorkItem(i, t, r.prompt or prompt(r.prompt_len or 1), r.max_tokens, "trace")
            for i, (r, t) in enumerate(zip(rows, times, strict=True))
        ]
        return sorted(items, key=lambda w: w.arrival)
    times = arrival_offsets(spec.num_requests, spec.request_rate, spec.burstiness, rng)
    items = []
    for i, t in enumerate(times):
        kind, prompt_len, output_len = draw_lengths(spec.classes, spec.sigma, rng)
        items.append(WorkItem(i, t, prompt(prompt_len), output_len, kind))
    return items


def workload_spec(args: argparse.Namespace, max_len: int, defaults: dict[str, Any]) -> WorkloadSpec:
    """The workload from `tide bench`'s flags, falling back to a scenario's defaults, then the
    general ones."""

    def pick(name: str, general: Any) -> Any:
        value = getattr(args, name)
        return value if value is not None else defaults.get(name, general)

    cap = args.max_len or max_len
    short, long_ = pick("short_len", (32, 32)), pick("long_len", (192, 128))
    long_fraction = pick("long_fraction", 0.2)
    prefix = pick("shared_prefix_len", 0)
    if prefix < 0 or prefix + 2 >= cap:
        raise ValueError(f"--shared-prefix-len must be in [0, {cap - 3}], got {prefix}")
    room = cap - prefix
    classes = [
        LengthClass(
            "short", 1 - long_fraction, short[0], short[1], defaults.get("short_cap", room)
        ),
        LengthClass("long", long_fraction, long_[0], long_[1], room),
    ]
    num = pick("num_requests", 50)
    rate = pick("request_rate", 5.0)
    if args.duration and args.num_requests is None and not math.isinf(rate):
        num = max(num, math.ceil(rate * args.duration * 2) + 10)  # enough for the duration
    return WorkloadSpec(
        num_requests=num,
        request_rate=rate,
        burstiness=pick("burstiness", 1.0),
        seed=args.seed,
        classes=[c for c in classes if c.share > 0],
        sigma=args.sigma,
        shared_prefix_len=prefix,
        trace=read_request_trace(args.trace) if args.trace else None,
    )
