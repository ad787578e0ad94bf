"""The plan as a few lines at the start of a run: where the model and the data come from, what
is random or synthetic, how the run lies over the ranks, in which precision."""

from __future__ import annotations

from paratrain.config.levers import PLAIN
from paratrain.runplan.sources import BUNDLED


def lines(plan, built: dict | None = None) -> list[str]:
    """What rank 0 prints before step 1; `built`: counts known once the model and data exist
    (parameters, trainable, rows)."""
    built = built or {}
    out = [
        ("model", model_line(plan, built)),
        ("data", data_line(plan, built)),
        ("task", plan.task),
        ("layout", layout_line(plan)),
        ("precision", precision_line(plan)),
    ]
    out += [("note", note) for note in plan.notes]
    out += lever_lines(plan)
    out += [("hint", hint) for hint in plan.hints]
    return [f"  {key:<10} {text}" for key, text in out]


def lever_lines(plan) -> list[tuple[str, str]]:
    """Every lever the user set, as set (a value the user gave is never hidden in a summary);
    then the levers the plan switched on, each with its reason; the rest in one line (plan.json
    holds every one with its reason)."""
    out = [("lever", f"{c.key}={value_text(c.value)} (set)") for c in plan.levers if c.by == "set"]
    on = [c for c in plan.levers if c.by == "auto" and c.value != PLAIN[c.key]]
    out += [("lever", f"{c.key}={value_text(c.value)}: {c.reason}") for c in on]
    plain = [c for c in plan.levers if c.by in ("auto", "plain") and c not in on]
    if plain and not on:  # a CPU, levers=plain: the reason most of them share
        reasons = [c.reason for c in plain]
        common = max(set(reasons), key=reasons.count)
        others = "the others plain" if out else "plain"
        out.append(("levers", f"{others} ({common}; plan.json says why each)"))
    elif plain:
        text = ", ".join(c.key.split(".")[1] for c in plain)
        out.append(("plain", f"{text} (plan.json says why each)"))
    return out


def value_text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def model_line(plan, built: dict) -> str:
    m = plan.model
    where = {
        "path": f"{m.where} (Hugging Face folder)",
        "shape": f"shape {m.where}",
        "builder": m.where,
        "python": m.where,
    }[m.kind]
    weights = {"loaded": "weights loaded", "random": "RANDOM weights", "as given": "as given"}
    text = f"{where}: {weights[m.weights]}"
    if built.get("parameters"):
        text += f", {built['parameters']:,} parameters"
        trainable = built.get("trainable")
        if trainable is not None and trainable != built["parameters"]:
            text += f" ({trainable:,} trained)"
    return text


def data_line(plan, built: dict) -> str:
    d = plan.data
    if d.source == "python":
        text = "the data sets given to paratrain.train"
    elif d.synthetic:
        text = f"{d.source}: SYNTHETIC (random samples, not data)"
    elif d.source in BUNDLED:
        text = f"{d.source} ({BUNDLED[d.source]})"
    else:
        text = f"{d.source} from {d.path}"
    rows = built.get("rows") or {}
    if rows:
        text += f", {rows.get('train', 0):,} training / {rows.get('val', 0):,} held-out rows"
    return text


def layout_line(plan) -> str:
    lay = plan.layout
    shape = " x ".join(f"{a}={v}" for a, v in lay.degrees.items() if v > 1) or "1 rank"
    wrapper = {"ddp": "DDP", "fsdp": "FSDP2", "data-parallel": "DataParallel"}.get(lay.wrapper)
    parts = [f"{plan.label} x{plan.world_size} on {plan.device}", shape]
    if wrapper:
        parts.append(wrapper)
    if lay.dp_size > 1:
        parts.append(f"{lay.sampler} sampler")
    return ", ".join(parts) + (
        " (REDUNDANT data: every rank reads every sample)" if plan.redundant else ""
    )


def precision_line(plan) -> str:
    cfg = plan.config
    fp8 = cfg.model.fp8 if plan.task_spec.fp8 and cfg.model.fp8 != "none" else None
    return cfg.precision + (f" with float8 ({fp8}) linear layers" if fp8 else "")
