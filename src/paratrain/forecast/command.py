"""`paratrain plan RECIPE --gpus 1,2,4,8,64`: calibrate here, predict every strategy at every
scale, and with --measure run the scales this machine has and print each prediction beside its
measurement. Writes forecast.json (the calibration, links, assumptions, rows, measurements)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from paratrain.bench import arith
from paratrain.config import RunConfig
from paratrain.errors import UserError
from paratrain.forecast.calibrated import calibrate, predict, spread
from paratrain.forecast.calibrated.model import Calibration, Links
from paratrain.meters.metrics import memory_capacity_bytes

BUCKET = 25 * 2**20  # DDP's default bucket: the all-reduce size the link is measured at
GPU_SCALES = [1, 2, 4, 8, 64]  # --gpus unless given, on GPUs (on the CPU: Plan.default_scales)


@dataclass
class PlanArgs:
    gpus: list[int] | None
    """The scales to predict (None: Plan.default_scales)."""
    per_node: int | None = None
    bus_gbps: float | None = None
    inter_node_gbps: float | None = None
    every: int = 16
    measure: list[int] | None = None
    steps: int = 20
    out: Path = Path("plan")
    strategies: list[str] | None = None
    """Only these (default: every one the task has)."""
    window_s: float = 10.0
    """CPU: how long the copies of a shared-machine calibration run together."""
    tries: int = spread.TRIES
    """Calibrations whose step spreads are measured again, at most this many times each."""
    allow_noisy: bool = False
    """Plan from the steadiest try instead of refusing a noisy machine."""


def parse_scales(text: str, flag: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise UserError(f"{flag}: expected numbers like 1,2,4,8, got {text!r}") from None
    if not values or values[0] < 1:
        raise UserError(f"{flag}: expected numbers >= 1, got {text!r}")
    return values


def _on_cpu(cfg: RunConfig) -> bool:
    import torch

    return cfg.device == "cpu" or not torch.cuda.is_available()


class Plan:
    """One plan's measurements, made once each and kept (forecast.json records them)."""

    def __init__(self, cfg: RunConfig, args: PlanArgs):
        import torch

        from paratrain.launch.torchrun import cores

        self.cfg, self.args = cfg, args
        self.cpu = _on_cpu(cfg)
        self.cores = cores()
        # the devices of this machine: its GPUs, or on the CPU as many processes as its
        # cores (at least 4); a larger scale spans machines like this one
        self.local = max(4, self.cores) if self.cpu else torch.cuda.device_count()
        self.per_node = args.per_node or (self.local if self.local > 1 else 8)
        self.unit = "process" if self.cpu else "GPU"  # what a scale counts, in every line
        over = [n for n in args.measure or [] if n > self.local]
        if over:
            raise UserError(
                f"--measure: this machine runs at most {self.local} "
                f"{'processes' if self.cpu else 'GPUs'}, got {over[0]}"
            )
        # (threads (0 on GPUs), wrapper, copies at once) -> the calibration's result.json
        self.calibrations: dict[tuple[int, str, int], dict] = {}
        self.buses: dict[int, float] = {}
        self.load = spread.load_note(self.cores)  # said before the timings it may disturb
        if self.load:
            print(f"plan: {self.load}; the calibrations may be noisy", flush=True)

    def default_scales(self) -> list[int]:
        """On GPUs GPU_SCALES; on the CPU the processes of this machine (powers of two up to
        it, and it): a scale beyond it would be machines like this one joined by a network
        nothing here measures, so it is planned only when --gpus names it."""
        if not self.cpu:
            return list(GPU_SCALES)
        out = [1]
        while out[-1] * 2 <= self.per_node:
            out.append(out[-1] * 2)
        return sorted({*out, self.per_node})

    def threads(self, n: int) -> int | None:
        """CPU threads per process at N local processes, as `paratrain run` gives them
        (launch.cpu_threads, else a set OMP_NUM_THREADS, else the cores over the processes)."""
        if not self.cpu:
            return None
        from paratrain.launch.torchrun import threads_per_process

        return threads_per_process(self.cfg.launch, n)

    def result(self, n: int, wrapper: str = "single") -> dict:
        """The calibration at the threads a process gets at N local processes, under the
        wrapper the strategy trains with (FSDP's per-block hooks cost time even on one
        device; DDP on one process is the plain step). On the CPU, N local processes are
        calibrated as N copies running at once: what sharing the machine costs is measured,
        over a window long enough (--window, 10 s) for the copies to overlap."""
        local = min(n, self.per_node)
        return self.calibration(self.threads(local), wrapper, local if self.cpu else 1)

    def calibration(self, threads: int | None, wrapper: str, copies: int) -> dict:
        """One calibration (copies at once, threads each), measured until steady
        (forecast/calibrated/spread.py), once per plan."""
        key = (threads or 0, wrapper, copies)
        if key not in self.calibrations:
            steps = self.args.steps
            if copies > 1:  # the copies start a second or so apart: overlap most of the window
                alone = self.result(1, wrapper)["summary"]["step_time_s"]
                window = self.args.window_s
                steps = min(max(steps, int(window / max(alone, 1e-3))), 10 * steps)
            what = f", {threads} thread{'s' if threads != 1 else ''} per process" if threads else ""
            also = f", {copies} copies at once" if copies > 1 else ""
            print(
                f"plan: calibrating one device ({wrapper}{what}{also}): {steps} steps", flush=True
            )
            folder = self.args.out / f"calibration_{wrapper}_{key[0]}x{copies}"
            self.calibrations[key] = spread.steady(
                lambda attempt: calibrate.measure_step(
                    self.cfg,
                    folder.with_name(folder.name + (f"_try{attempt}" if attempt > 1 else "")),
                    steps=steps,
                    threads=threads,
                    wrapper=wrapper,
                    copies=copies,
                    # watched: a calibration stopped at its first noisy window (spread.py)
                    noisy_above=None if self.args.allow_noisy else spread.LIMIT,
                ),
                f"one device ({wrapper}{what}{also})",
                tries=self.args.tries,
                allow_noisy=self.args.allow_noisy,
                load=self.load,
            )
        return self.calibrations[key]

    def starved(self) -> str | None:
        """On the CPU, where one process runs several threads: the one-device step at one
        thread as well; a line when the threads made it far slower (they waited for cores
        that other processes hold), else None. Asked only where a row scaled above ideal."""
        threads = self.threads(1) or 1
        if not self.cpu or threads <= 1:
            return None
        many = self.result(1)["summary"]["step_time_s"]
        one = self.calibration(1, "single", 1)["summary"]["step_time_s"]
        return spread.starved(many, one, threads, self.load)

    def cal_at(self, n: int, strategy: str = "ddp") -> Calibration:
        wrapper = "fsdp" if strategy in ("fsdp", "hsdp") else "single"
        return calibrate.from_result(self.result(n, wrapper))

    def links(self) -> Links:
        a = self.args
        if a.bus_gbps:
            return Links(a.bus_gbps, a.inter_node_gbps, self.per_node)
        here = min(self.per_node, max(self.local, 1))
        wide = [n for n in a.gpus if 1 < n <= here]
        if not wide and here > 1:  # only scales beyond this machine: measure all of it
            wide = [here]
        if not wide:
            raise UserError(
                "plan: one GPU here, no link to measure: give --bus-gbps (the bus bandwidth "
                "`paratrain comm` prints on the target machine) and, across nodes, "
                "--inter-node-gbps"
            )
        grads = calibrate.from_result(self.result(1))
        size = int(min(BUCKET, grads.trained * grads.ddp_grad_bytes))
        for n in wide:
            if n not in self.buses:
                print(f"plan: all-reduce of {size / 2**20:,.1f} MiB on {n} processes", flush=True)
                self.buses[n] = calibrate.measure_bus(
                    n, size, "cpu" if self.cpu else "cuda", a.out / f"comm_{n}"
                )
        top = self.buses[max(self.buses)]
        return Links(top, a.inter_node_gbps, self.per_node, tuple(sorted(self.buses.items())))

    def memory_limit(self, n: int) -> float | None:
        if self.cpu:  # the processes of one machine share its memory
            return memory_capacity_bytes(False) / min(n, self.per_node)
        return memory_capacity_bytes(True)


def samples_per_step(cfg: RunConfig) -> int:
    return cfg.data.batch_size * cfg.train.grad_accum_steps


def measured_runs(plan: Plan, rows: list[dict]) -> list[dict]:
    """Each planned row at a scale in --measure, run for real with the calibration's settings."""
    a = plan.args
    out = []
    todo = [r for r in rows if r["gpus"] in (a.measure or []) and r["fits"]]
    for i, r in enumerate(todo, 1):
        n, strategy = r["gpus"], r["plan_strategy"]
        settings = [*predict.RUNS[strategy], f"launch.nproc={n}"]
        if strategy == "local_sgd":
            settings.append(f"sync.every_steps={a.every}")
        if strategy == "hsdp":  # shards within a node, one replica per node
            settings.append(f"parallel.dp_replicate={n // plan.per_node}")
        print(f"plan: [{i}/{len(todo)}] measuring {r['strategy']} on {n}", flush=True)
        try:
            result = calibrate.measure_step(
                plan.cfg,
                a.out / f"measured_{r['strategy'].replace('/', '_')}_{n}",
                steps=a.steps,
                threads=plan.threads(n),
                run_as=settings,
            )
        except UserError as e:
            out.append({"strategy": r["strategy"], "gpus": n, "error": str(e)})
            continue
        s = result["summary"]
        out.append(
            {
                "strategy": r["strategy"],
                "gpus": n,
                "step_s": s["step_time_s"],
                "samples_per_s": s["unique_samples_per_s"],
                "memory_bytes": s["peak_memory_bytes"],
                "step_error": r["step_s"] / s["step_time_s"] - 1,
                "memory_error": r["memory_bytes"] / s["peak_memory_bytes"] - 1,
            }
        )
    return out


def assumptions(plan: Plan, links: Links) -> list[str]:
    unit = plan.unit
    lines = [
        f"per-{unit} batch fixed for the data-parallel strategies (N replicas); tensor and "
        f"pipeline parallel train one replica over N {predict.plural(unit)}",
        f"link: {describe_links(plan, links)}",
        "DDP: buckets all-reduce under the backward, the last bucket exposed; FSDP: the "
        "all-gathers and reduce-scatters hidden under forward + backward as far as they fit",
        f"local SGD averages the weights every {plan.args.every} steps (it learns differently)",
        "tensor parallel: 4 all-reduces of a layer's activations per layer and micro-batch, "
        "none hidden; activations not split (no sequence parallelism)",
        f"pipeline: the bubble (p-1)/(m+p-1) at m={plan.cfg.pipeline.microbatches} micro-batches; "
        "transfers between stages ignored",
    ]
    if plan.cpu:
        lines.append(
            f"CPU: N processes share this machine's {plan.cores} cores; calibrated as N copies "
            "running at once, each with the threads `paratrain run` gives it; memory is each "
            "process's peak resident set"
        )
    return lines


def describe_links(plan: Plan, links: Links) -> str:
    if links.measured:
        inside = ", ".join(f"{predict.bandwidth(g)} at {n}" for n, g in links.measured)
        inside = f"measured all-reduce bus bandwidth {inside}"
    else:
        inside = f"{predict.bandwidth(links.intra_gbps)} within a node (stated)"
    node = "machine" if plan.cpu else "node"
    across = (
        f"; {predict.bandwidth(links.inter_gbps)} across {node}s (stated)"
        if links.inter_gbps
        else f"; across {node}s as within (no --inter-node-gbps)"
    )
    if max(plan.args.gpus or [1]) <= links.per_node:
        across = ""  # every scale within one
    return f"{inside}{across}; {predict.count(links.per_node, plan.unit)} per {node}"


def starved(plan: Plan, rows: list[dict]) -> str | None:
    """Where a row scaled above ideal: whether one device's threads waited for cores (then
    refused, unless --allow-noisy)."""
    if not any(scaling_flag(r) for r in rows):
        return None
    line = plan.starved()
    if line and not plan.args.allow_noisy:
        raise UserError(f"plan: {line}; or pass --allow-noisy to plan anyway")
    return line


def run_plan(cfg: RunConfig, args: PlanArgs) -> dict:
    plan = Plan(cfg, args)
    args.gpus = sorted(set(args.gpus or plan.default_scales()) | set(args.measure or []))
    args.out.mkdir(parents=True, exist_ok=True)
    cal = calibrate.from_result(plan.result(1))
    links = plan.links() if any(n > 1 for n in args.gpus) else Links(0.0, None, plan.per_node)
    state = plan.result(1)["summary"]["model_state"]
    strategies = predict.strategies_for(cfg.task, state.get("blocks") or 0, args.every)
    if args.strategies:
        unknown = [x for x in args.strategies if x not in strategies]
        if unknown:
            raise UserError(
                f"--strategies: {unknown[0]} is not planned for this recipe; choose from "
                + ", ".join(strategies)
            )
        strategies = [x for x in strategies if x in args.strategies]
    rows = predict.plan_rows(
        plan.cal_at,
        args.gpus,
        links,
        strategies,
        samples_per_step=samples_per_step(cfg),
        memory_limit=plan.memory_limit,
        every=args.every,
        pp_micro=cfg.pipeline.microbatches,
        limits=state,
    )
    found = {
        "recipe": cfg.name,
        "device": "cpu" if plan.cpu else "cuda",
        "unit": plan.unit,
        "per_node": plan.per_node,
        "calibration": asdict(cal),
        "calibration_step_s": plan.result(1)["summary"]["step_time_s"],
        "calibration_step_spread": plan.result(1)["summary"]["spread"],
        "calibrations": {
            f"{wrapper}, {threads or 1} threads, {copies} at once": r["summary"]["step_time_s"]
            for (threads, wrapper, copies), r in plan.calibrations.items()
        },
        # each calibration's windows' coefficient of variation, the tries it took, and
        # whether it stayed above the limit (--allow-noisy)
        "calibration_spread": {
            f"{wrapper}, {threads or 1} threads, {copies} at once": {
                k: r["summary"][k] for k in ("spread", "tries", "noisy", "step_windows_s")
            }
            for (threads, wrapper, copies), r in plan.calibrations.items()
        },
        "load": plan.load,
        "links": {"description": describe_links(plan, links), "measured": plan.buses},
        "assumptions": assumptions(plan, links),
        "rows": rows,
        "advice": predict.advice(rows, links, plan.unit),
    }
    found["starved"] = starved(plan, rows)
    if args.measure:
        found["measured"] = measured_runs(plan, rows)
    (args.out / "forecast.json").write_text(json.dumps(found, indent=1, default=str) + "\n")
    return found


ABOVE_IDEAL = (
    "scaling above 100%: N devices predicted faster per device than the one-device calibration, "
    "suspect until explained (bench/arith.py's rule, as `paratrain report` flags it): a "
    "one-device step that waited on other processes (see its spread), or on the CPU one "
    "process's threads using the cores less well than N single-thread processes"
)


def scaling_flag(r: dict) -> str:
    """` ⚠ above the ideal Nx: suspect` for a row whose scaling efficiency is above 100%."""
    return arith.suspect(r["scaling_efficiency"] * r["gpus"], r["gpus"])


def scaling_cell(r: dict) -> str:
    """The table's cell: the efficiency, marked ⚠ above ideal (the note below says why)."""
    return f"{r['scaling_efficiency']:.0%}" + (" ⚠" if scaling_flag(r) else "")


def scale_cell(n: int, found: dict) -> str:
    """N, and beyond one node (on the CPU: one machine like this) how many of them."""
    per_node = found.get("per_node") or n
    if n <= per_node:
        return str(n)
    node = "machine" if found.get("unit") == "process" else "node"
    return f"{n} ({predict.count(-(-n // per_node), node)})"


def print_header(console, found: dict) -> None:
    """One device's step and its parts, its spread; the noisy calibrations planned from."""
    cal = found["calibration"]
    one = "one process's" if found.get("unit") == "process" else "one device's"
    console.print(
        f"[bold]paratrain plan[/] {found['recipe']} on {found['device']}: {one} step "
        f"{found['calibration_step_s'] * 1000:,.1f} ms (forward {cal['forward_s'] * 1000:,.1f}, "
        f"backward {cal['backward_s'] * 1000:,.1f}, optimizer {cal['optimizer_s'] * 1000:,.1f}, "
        f"other {cal['other_s'] * 1000:,.1f}; spread {found['calibration_step_spread']:.0%}), "
        f"{cal['params']:,} parameters ({cal['trainable'] or cal['params']:,} trained)"
    )
    noisy = [k for k, v in found.get("calibration_spread", {}).items() if v["noisy"]]
    if noisy:
        console.print(
            f"  [bold]noisy:[/] calibrations {'; '.join(noisy)} spread above "
            f"{spread.LIMIT:.0%} (--allow-noisy): every row is uncertain by as much",
            highlight=False,
        )


def print_plan(found: dict) -> None:
    from rich.table import Table

    from paratrain.meters.metrics import console as wide_console

    console = wide_console()  # in a log file or a pipe, each line and the table whole
    print_header(console, found)
    measured = {(m["strategy"], m["gpus"]): m for m in found.get("measured", [])}
    table = Table()
    unit = found.get("unit", "GPU")
    columns = [
        "strategy",
        predict.plural(unit),
        "step ms",
        "samples/s",
        "scaling",
        "comm ms",
        "exposed",
        f"memory/{unit}",
    ]
    if measured:
        columns += ["measured ms", "error", "measured memory"]
    for col in columns:
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for r in found["rows"]:
        cells = [
            r["strategy"],
            scale_cell(r["gpus"], found),
            f"{r['step_s'] * 1000:,.1f}",
            f"{r['samples_per_s']:,.1f}",
            scaling_cell(r),
            f"{r['comm_s'] * 1000:,.1f}",
            f"{r['exposed_share']:.0%}",
            f"{r['memory_bytes'] / 2**20:,.0f} MiB" + ("" if r["fits"] else " (no fit)"),
        ]
        if measured:
            m = measured.get((r["strategy"], r["gpus"]))
            if m and "error" not in m:
                cells += [
                    f"{m['step_s'] * 1000:,.1f}",
                    f"{m['step_error']:+.1%}",
                    f"{m['memory_bytes'] / 2**20:,.0f} MiB",
                ]
            else:
                cells += ["failed" if m else "", "", ""]
        table.add_row(*cells)
    console.print(table)
    if any(scaling_flag(r) for r in found["rows"]):
        console.print(f"  ⚠ {found.get('starved') or ABOVE_IDEAL}", highlight=False)
    for line in found["assumptions"]:
        console.print(f"  assumes: {line}", highlight=False)
    for line in found["advice"]:
        console.print(f"  {line}", highlight=False)
    errors = [abs(m["step_error"]) for m in measured.values() if "step_error" in m]
    if errors:
        console.print(
            f"  prediction error over {len(errors)} measured rows: mean {sum(errors) / len(errors):.1%}, "
            f"worst {max(errors):.1%}",
            highlight=False,
        )
