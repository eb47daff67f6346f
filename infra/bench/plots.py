"""``tide bench``'s plots: latency CDFs and a timeline of tokens/s and queue depth."""

from __future__ import annotations

from pathlib import Path

from tide_fleet.infra.bench.load import RequestRecord, RunResult


def tokens_per_second(records: list[RequestRecord]) -> list[int]:
    """Output tokens in each second of the run: streamed tokens when they arrived; a batch
    job's tokens (never streamed) all in the second it finished."""
    stamps: list[tuple[float, int]] = []
    for r in records:
        if r.token_times:
            stamps += [(t, 1) for t in r.token_times]
        elif r.ok and r.finished is not None:
            stamps.append((r.finished, r.output_tokens))
    counts = [0] * (int(max((t for t, _ in stamps), default=-1)) + 1)
    for t, n in stamps:
        counts[int(t)] += n
    return counts


def write_plots(runs: dict[str, RunResult], out_dir: Path) -> list[Path]:
    """Latency CDFs and a timeline (tokens/s, queue depth), one line per run label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = [
        ("ttft", "TTFT"),
        ("tpot", "TPOT"),
        ("e2e", "end-to-end latency"),
        ("queue_s", "queue time"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (attr, title) in zip(axes.flat, metrics, strict=True):
        for label, run in runs.items():
            values = sorted(
                v * 1000 for r in run.records if r.ok and (v := getattr(r, attr)) is not None
            )
            if values:
                ax.step(
                    values,
                    [(i + 1) / len(values) for i in range(len(values))],
                    where="post",
                    label=label,
                )
        ax.set(title=title, xlabel="ms", ylabel="fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    cdf = out_dir / "latency_cdf.png"
    fig.savefig(cdf, dpi=100)
    plt.close(fig)

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for label, run in runs.items():
        counts = tokens_per_second(run.records)
        if counts:
            top.plot(range(len(counts)), counts, drawstyle="steps-post", label=label)
        qd = run.queue_depth
        bottom.plot([s["t"] for s in qd], [s["total"] for s in qd], label=f"{label}: queued")
        bottom.plot(
            [s["t"] for s in qd],
            [s["in_flight"] for s in qd],
            linestyle=":",
            label=f"{label}: in flight",
        )
    top.set(title="output tokens per second", ylabel="tokens/s")
    bottom.set(
        title="gateway queue depth (tide:queue_depth) and requests in flight",
        xlabel="seconds",
        ylabel="requests",
    )
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    timeline = out_dir / "timeline.png"
    fig.savefig(timeline, dpi=100)
    plt.close(fig)
    return [cdf, timeline]
