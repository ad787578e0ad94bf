"""PNG plots for the report (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from paratrain.bench.report import Group  # noqa: E402


def _name(g: Group, key: str) -> str:
    return g.label if key == "label" else str(g.get(key))


def _save_lines(fig, ax, path: Path) -> Path:
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def speedup_plot(groups: list[Group], path: Path, key: str = "strategy") -> Path | None:
    """Speedup vs processes per strategy, with the ideal line."""
    series: dict[str, dict[int, float]] = {}
    for g in groups:
        if g.thr:
            series.setdefault(_name(g, key), {})[g.nproc] = g.thr.median
    series = {k: v for k, v in series.items() if 1 in v and len(v) > 1}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    n_max = max(n for v in series.values() for n in v)
    ax.plot([1, n_max], [1, n_max], "k--", label="ideal")
    for name, points in sorted(series.items()):
        ns = sorted(points)
        ax.plot(ns, [points[n] / points[1] for n in ns], "o-", label=name)
    ax.set_xlabel("processes (GPUs)")
    ax.set_ylabel("speedup, unique samples/s")
    ax.set_xticks(range(1, n_max + 1))
    return _save_lines(fig, ax, path)


def _samples(g: Group) -> tuple[float, float, float]:
    return g.thr.median, g.thr.low, g.thr.high


def _tokens_per_gpu(g: Group) -> tuple[float, float, float]:
    values = sorted(m["tokens_per_s"] / g.nproc for m in g.metrics_list if m.get("tokens_per_s"))
    return values[len(values) // 2], values[0], values[-1]


def bars_plot(
    groups: list[Group], path: Path, key: str, title: str, tokens: bool = False
) -> Path | None:
    """Throughput and peak memory per value of `key` (precision, a label, ...); language models
    plot tokens/s per GPU, the figure their table compares."""
    value = _tokens_per_gpu if tokens else _samples
    items = [(f"{_name(g, key)} x{g.nproc}", g) for g in groups if g.thr]
    if tokens:
        items = [(n, g) for n, g in items if any(m.get("tokens_per_s") for m in g.metrics_list)]
    if not items:
        return None
    # Horizontal bars: configuration names are long and stay readable on the y axis.
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 1.2 + 0.45 * len(items)), sharey=True)
    names = [n for n, _ in items]
    stats = [value(g) for _, g in items]
    a.barh(
        names,
        [m for m, _, _ in stats],
        xerr=[[m - lo for m, lo, _ in stats], [hi - m for m, _, hi in stats]],
    )
    a.set_xlabel("tokens/s per GPU" if tokens else "unique samples/s")
    a.invert_yaxis()
    b.barh(names, [(g.mem.median if g.mem else 0) / 2**30 for _, g in items], color="tab:orange")
    b.set_xlabel("peak memory per device, GiB")
    for ax in (a, b):
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def loss_curves_plot(groups: list[Group], path: Path, title: str) -> Path | None:
    """Each configuration's training loss over the steps (its first repeat), on one axis: a
    faster configuration that learns worse shows at a glance."""
    series = [(f"{g.label} x{g.nproc}", g.curves[0]) for g in groups if g.curves]
    series = [(name, c) for name, c in series if len(c) > 1]
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, curve in series:
        ax.plot([s for s, _ in curve], [loss for _, loss in curve], label=name, lw=1.2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title(f"loss curves: {title}")
    return _save_lines(fig, ax, path)


def comm_plot(result: dict, path: Path) -> Path:
    """Bus bandwidth against message size, one line per collective (`paratrain comm`)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for op in dict.fromkeys(r["op"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["op"] == op]
        ax.plot([r["bytes"] for r in rows], [r["busbw_gbps"] for r in rows], "o-", label=op, ms=3)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size, bytes")
    ax.set_ylabel("bus bandwidth, GB/s")
    ax.set_title(f"{result['backend']}, {result['world_size']} ranks, {result['dtype']}")
    return _save_lines(fig, ax, path)


def sync_plot(groups: list[Group], path: Path, name: str) -> Path | None:
    """Held-out accuracy against the bytes each rank sends per step, one point per configuration
    (its seeds' median, the bar their range): where each way of agreeing sits."""
    from paratrain.bench.report import by_label, sync_point

    every = {k: sync_point(v) for k, v in by_label(groups).items()}
    # accuracy where the runs have it (images), else the held-out loss (language models)
    key, scale, ylabel = (
        ("acc", 100.0, "held-out accuracy, %")
        if any(p["acc"] for p in every.values())
        else ("loss", 1.0, "held-out loss")
    )
    points = {
        label: p for label, p in every.items() if p[key] and p["bytes"] and p["bytes"].median > 0
    }
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, p in points.items():
        v, b = p[key], p["bytes"].median
        ax.errorbar(
            [b],
            [v.median * scale],
            yerr=[[(v.median - v.low) * scale], [(v.high - v.median) * scale]],
            fmt="o",
            capsize=3,
            label=label,
        )
    ax.set_xscale("log")
    ax.set_xlabel("bytes sent per step per rank (log)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{name}: {ylabel.split(',')[0]} vs communication")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plots_for(kind: str, name: str, groups: list[Group], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    if kind == "dp_modes":
        made.append(speedup_plot(groups, out_dir / f"{name}_speedup.png"))
    elif kind == "precision":
        made.append(
            bars_plot(groups, out_dir / f"{name}_precision.png", "precision", "per precision")
        )
    elif kind == "variants":
        made.append(speedup_plot(groups, out_dir / f"{name}_speedup.png", key="label"))
        made.append(
            bars_plot(
                groups, out_dir / f"{name}_throughput.png", "label", "configurations and peers"
            )
        )
    elif kind == "sync":
        made.append(sync_plot(groups, out_dir / f"{name}_accuracy_bytes.png", name))
        # one seed's curves: three seeds per configuration would be a thicket
        groups = [g for g in groups if g.params.get("seed") in (None, 0)]
    else:
        made.append(
            bars_plot(groups, out_dir / f"{name}_runs.png", "label", name, tokens=kind == "llm")
        )
    made.append(loss_curves_plot(groups, out_dir / f"{name}_loss.png", name))
    return [p for p in made if p is not None]
