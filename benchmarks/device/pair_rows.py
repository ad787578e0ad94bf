"""The rows of a results DB side by side (tokens/s, or images/s for image runs; step time, MFU, peak memory, mean loss), the
ratio of each to a reference label, and the loss curves of label pairs on the same steps:
rows.md. Issue 34's table from one device call.

    python benchmarks/device/pair_rows.py RESULTS_DB OUT_MD [REFERENCE_LABEL] [A=B ...]
"""

import json
import sqlite3
import statistics
import sys


def rate(metrics: dict) -> float | None:
    """Tokens/s of a language model's run, images/s of an image model's."""
    return metrics.get("tokens_per_s") or metrics.get("unique_samples_per_s")


def main() -> None:
    db, out = sys.argv[1], sys.argv[2]
    ref = sys.argv[3] if len(sys.argv) > 3 else None
    pairs = [p.rsplit("=", 1) for p in sys.argv[4:]]  # a label may hold "="
    rows = {}
    for label, status, error, metrics, result in sqlite3.connect(db).execute(
        "select label, status, error, metrics, result from runs order by started_at"
    ):
        # a run without a result (timeout, failure) stores 'null': no metrics, no summary
        m, r = json.loads(metrics or "{}") or {}, json.loads(result or "{}") or {}
        rows[label] = (status, error, m, r)
    lines = [
        "| row | tokens/s (img/s) | ms/step | MFU | peak GiB | mean loss | vs reference |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    base = rate(rows.get(ref, (None, None, {}, {}))[2]) if ref else None
    for label, (status, error, m, _) in rows.items():
        if status != "ok":
            lines.append(f"| {label} | {status}: {(error or '')[:80]} | | | | | |")
            continue
        tps, mfu = rate(m), m.get("mfu")
        ratio = f"{tps / base:.3f}x" if base and tps else "-"
        lines.append(
            f"| {label} | {tps:,.0f} | {m['step_time_s'] * 1000:.1f} | "
            f"{(f'{mfu:.1%}' if mfu else '-')} | {m['peak_memory_bytes'] / 2**30:.1f} | "
            f"{m['train_loss']:.4f} | {ratio} |"
        )
    for a, b in pairs:  # loss curves on the same steps (bench's `curve`: interval means)
        if any(r not in rows or rows[r][0] != "ok" for r in (a, b)):  # call 42: a timeout
            continue
        ca = dict(map(tuple, rows[a][3].get("curve") or []))
        cb = dict(map(tuple, rows[b][3].get("curve") or []))
        common = sorted(set(ca) & set(cb))
        if not common:
            continue
        rel = [abs(ca[s] - cb[s]) / abs(cb[s]) for s in common]
        half = common[len(common) // 2 :]
        noise = (
            statistics.fmean(
                abs(cb[s] - cb[t]) / abs(cb[t]) for t, s in zip(half[:-1], half[1:], strict=True)
            )
            if len(half) > 1
            else float("nan")
        )
        lines.append("")
        lines.append(
            f"curves {a} vs {b}: {len(common)} points, first {ca[common[0]]:.3f} / "
            f"{cb[common[0]]:.3f}, last {ca[common[-1]]:.3f} / {cb[common[-1]]:.3f}, mean rel. "
            f"diff (2nd half) {statistics.fmean(rel[len(rel) // 2 :]):.2%}, {b}'s own "
            f"point-to-point change (2nd half) {noise:.2%}"
        )
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
