"""Each run of forecast_memory.sh beside the analytic forecast: the tensors' peak and the
allocator's, and the forecast's parts (state, activations, the transient peak).

    python3 benchmarks/device/forecast_memory.py RUNS_DIR DONE_FILE OUT
    python3 benchmarks/device/forecast_memory.py --small      # checks the mapping on the CPU
    python3 benchmarks/device/forecast_memory.py --again RESULTS/memory.json   # priced again

DONE_FILE: a line per finished run, `label|recipe|overrides` (the shell script's RUNS)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from work_kinds_calibrate import RECIPES  # the recipes as the forecast's Training (this folder)

from paratrain.forecast import shapes
from paratrain.forecast.analytic import hardware
from paratrain.forecast.analytic.step import Cut, Training, predict


def training_of(recipe: str, overrides: str) -> tuple[str, Training]:
    """A recipe's Training as the calibration script maps it (its RECIPES: the recipes' own
    levers), changed by the run's --set overrides."""
    shape, train = RECIPES[recipe]
    words = dict(w.split("=", 1) for w in overrides.split() if "=" in w)
    changed = {
        "seq_len": int(words.get("data.max_length", train.seq_len)),
        "local_batch": int(words.get("data.batch_size", train.local_batch)),
    }
    if words.get("train.activation_checkpointing") == "true":
        changed["ac"] = "full"
    if words.get("train.sdpa_backend") in ("flash", "cudnn"):
        changed["attention"] = words["train.sdpa_backend"]
    return shape, replace(train, **changed)


def profile_here() -> str:
    """The shipped profile of the GPU this runs on (an H200 or an H100 SXM is lent)."""
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    return "h200" if "H200" in name else "h100-sxm"


def forecast(label: str, recipe: str, over: str, profile: str) -> dict:
    """One run's row as the forecast prices it now (the measured fields come apart)."""
    hw = hardware.load(profile)
    shape, train = training_of(recipe, over)
    p = predict(shapes.shape(shape), hw, Cut(1), train)
    m = p["memory"]
    return {
        "run": label,
        "profile": hw.name,
        "recipe": recipe,
        "overrides": over,
        "batch": train.local_batch,
        "seq": train.seq_len,
        "ac": train.ac,
        "attention": train.attention or hw.attention_backend,
        "predicted_tps": p["tps_per_gpu"],
        "predicted_gib": p["memory_gib"],
        "state_gib": m["state_bytes"] / 2**30,
        "activation_gib": m["activation_bytes"] / 2**30,
        "peak_gib": m["peak_bytes"] / 2**30,
    }


def rows(runs: Path, done: list[str]) -> list[dict]:
    out = []
    for line in done:
        label, recipe, over = line.split("|", 2)
        s = json.loads((runs / label / "result.json").read_text())["summary"]
        out.append(
            {
                **forecast(label, recipe, over, profile_here()),
                "tokens_per_s": s.get("tokens_per_s"),
                "allocated_gib": s["peak_memory_bytes"] / 2**30,
                "reserved_gib": (s.get("peak_reserved_bytes") or 0) / 2**30,
                "floor": s.get("floor"),  # train.floor's: the step's matmuls + attention alone
            }
        )
    return out


def again(measured: Path) -> list[dict]:
    """A call's memory.json priced again by today's forecast (its measurements kept)."""
    return [
        {**r, **forecast(r["run"], r["recipe"], r["overrides"], r["profile"])}
        for r in json.loads(measured.read_text())
    ]


def table(found: list[dict]) -> str:
    lines = [
        "| run | batch x seq, AC, attention | tokens/s | forecast | error | allocated GiB | reserved GiB "
        "| forecast GiB (state + activations + peak) | vs reserved |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in found:
        tps = r["tokens_per_s"] or 0
        err = f"{r['predicted_tps'] / tps - 1:+.1%}" if tps else "-"
        res = r["reserved_gib"]
        lines.append(
            f"| {r['run']} | {r['batch']} x {r['seq']}, {r['ac']}, {r['attention']} | {tps:,.0f} | "
            f"{r['predicted_tps']:,.0f} | {err} | {r['allocated_gib']:.1f} | {res:.1f} | "
            f"{r['predicted_gib']:.1f} ({r['state_gib']:.1f} + {r['activation_gib']:.1f} + "
            f"{r['peak_gib']:.1f}) | {(r['predicted_gib'] / res - 1) if res else 0:+.1%} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    if sys.argv[1:2] == ["--again"]:  # --again RESULTS/memory.json: the table at this commit
        print(table(again(Path(sys.argv[2]))), end="")
        return
    if sys.argv[1:] == ["--small"]:
        for recipe in RECIPES:
            for over in ("", "--set data.batch_size=4 --set train.activation_checkpointing=true"):
                print(recipe, over, training_of(recipe, over))
        return
    runs, done, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    found = rows(runs, [x for x in done.read_text().splitlines() if x.strip()])
    (out / "memory.json").write_text(json.dumps(found, indent=1))
    (out / "memory.md").write_text(table(found))
    print(table(found))


if __name__ == "__main__":
    main()
