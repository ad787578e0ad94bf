"""Lay paratrain's per-step losses (steps.jsonl at log.every_steps=1) over the plain loop's
(hf_lora's summary.losses) on the same batches: curve.json, curve.png, and one line of how far
apart they are.

    python benchmarks/device/loss_curves.py STEPS_JSONL PLAIN_RESULT_JSON OUT_DIR
"""

import json
import statistics
import sys
from pathlib import Path


def main() -> None:
    steps, plain, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    ours = [json.loads(line)["loss"] for line in steps.read_text().splitlines()]
    theirs = json.loads(plain.read_text())["summary"]["losses"]
    n = min(len(ours), len(theirs))
    rel = [abs(a - b) / abs(b) for a, b in zip(ours[:n], theirs[:n], strict=True)]
    tail = rel[n // 2 :]
    stats = {
        "steps": n,
        "first_loss": [ours[0], theirs[0]],
        "last_loss": [ours[n - 1], theirs[n - 1]],
        "max_rel_diff": max(rel),
        "mean_rel_diff_second_half": statistics.fmean(tail),
        # the step-to-step noise of the plain loop's own curve, for scale: the mean relative
        # change between consecutive steps over the second half
        "plain_step_to_step_rel_change": statistics.fmean(
            abs(theirs[i] - theirs[i - 1]) / abs(theirs[i - 1]) for i in range(n // 2 + 1, n)
        ),
    }
    (out / "curve.json").write_text(json.dumps({**stats, "paratrain": ours, "plain": theirs}))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(1, n + 1), theirs[:n], label="plain transformers loop (compiled)", lw=2)
    ax.plot(range(1, n + 1), ours[:n], label="paratrain run (compiled)", lw=1, ls="--")
    ax.set(xlabel="optimizer step", ylabel="training loss", title="Same init, same batches")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curve.png", dpi=120)
    print(
        f"curves over {n} steps: max relative difference {stats['max_rel_diff']:.2e}, mean over "
        f"the second half {stats['mean_rel_diff_second_half']:.2e} (the plain loop's own "
        f"step-to-step change {stats['plain_step_to_step_rel_change']:.2e}); last loss "
        f"{ours[n - 1]:.4f} vs {theirs[n - 1]:.4f}"
    )


if __name__ == "__main__":
    main()
