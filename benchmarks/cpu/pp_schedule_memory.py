"""Activations each pipeline rank really holds under torch's own schedules, against the planner.

paratrain's planner (src/paratrain/forecast/analytic/step.py, memory_terms) says rank r of p holds, per
layer of its stage, `flight` micro-batches of saved activations: GPipe m, 1F1B min(m, p - r),
interleaved 1F1B (v stages a rank) chunks / v with chunks = min(m v, (v-1) p + 2 (p-1-r) + 1).
This runs torch.distributed.pipelining's ScheduleGPipe, Schedule1F1B and
ScheduleInterleaved1F1B (v = 2, stages r and r + p on rank r) on p = 4 CPU processes (gloo) over
a stack of identical MLP blocks, with and without full activation checkpointing per block, and
measures each rank's peak live activation bytes during one schedule.step().

How it measures: a torch.autograd.graph.saved_tensors_hooks pack hook sees every tensor autograd
saves for backward (with non-reentrant checkpoint only the block's input, which checkpoint saves
through the same hooks; the recomputation's saves go to checkpoint's own hooks). Parameters
(and their transposed views) are skipped. Each saved tensor is keyed by (data_ptr, bytes) so
that two ops saving the same tensor count once; the pack hook returns a holder whose
weakref.finalize lowers the count when autograd frees the graph (after that micro-batch's
backward). The stage outputs that PipelineStage keeps in fwd_cache until their backward are
counted too, in a second column (a weakref.finalize on the output tensor). The unit, one
block's saved activations for one micro-batch, is measured the same way in a plain
single-process forward.

    PYTHONPATH=src python3 benchmarks/cpu/pp_schedule_memory.py
"""

import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.utils.checkpoint import checkpoint

P = 4  # pipeline ranks
V = 2  # stages a rank under interleaving
LAYERS = 8  # blocks in all: 2 a rank, so 2 a stage (1F1B, GPipe) or 1 a stage (interleaved)
H = 256  # hidden size
TOKENS = 256  # rows of one micro-batch: one block's saved activations are 9 H TOKENS fp32 = 2.4 MB
MICRO = (4, 8)  # m = p, and m = 2p
SCHEDULES = ("gpipe", "1f1b", "interleaved")
OUT = Path(__file__).resolve().parents[1] / "results" / "2026-12-06-cpu" / "pp_memory"


class Block(nn.Module):
    """x + W2 gelu(W1 x): saves x, W1 x and gelu(W1 x) for backward (9 H floats a row)."""

    def __init__(self, ac):
        super().__init__()
        self.fc1, self.fc2, self.act, self.ac = (
            nn.Linear(H, 4 * H),
            nn.Linear(4 * H, H),
            nn.GELU(),
            ac,
        )

    def mlp(self, x):
        return self.fc2(self.act(self.fc1(x)))

    def forward(self, x):
        if self.ac:  # full AC: only the block's input is kept, the rest recomputed in backward
            return x + checkpoint(self.mlp, x, use_reentrant=False)
        return x + self.mlp(x)


class Tracker:
    """Live bytes of saved tensors (and kept stage outputs) and their peaks."""

    def __init__(self, params):
        self.skip = {p.untyped_storage().data_ptr() for p in params}
        self.saved, self.outs = {}, {}  # key -> [count, bytes]
        self.now = {"saved": 0, "outs": 0}
        self.peak = {"saved": 0, "all": 0}

    def _add(self, table, kind, key, nbytes):
        entry = table.setdefault(key, [0, nbytes])
        if entry[0] == 0:
            self.now[kind] += nbytes
        entry[0] += 1
        self.peak["saved"] = max(self.peak["saved"], self.now["saved"])
        self.peak["all"] = max(self.peak["all"], self.now["saved"] + self.now["outs"])

    def _drop(self, table, kind, key):
        entry = table[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.now[kind] -= entry[1]
            del table[key]

    def pack(self, t):
        if t.untyped_storage().data_ptr() in self.skip:
            return t  # a weight: not an activation
        key = (t.data_ptr(), t.numel() * t.element_size())
        holder = Held(t)
        self._add(self.saved, "saved", key, key[1])
        weakref.finalize(holder, self._drop, self.saved, "saved", key)
        return holder

    @staticmethod
    def unpack(obj):
        return obj.t if isinstance(obj, Held) else obj

    def keep_output(self, t):
        key = (t.data_ptr(), t.numel() * t.element_size())
        self._add(self.outs, "outs", key, key[1])
        weakref.finalize(t, self._drop, self.outs, "outs", key)

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


class Held:
    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t


class StageModule(nn.Module):
    """The blocks of one stage; registers its output with the tracker (PipelineStage keeps it)."""

    def __init__(self, blocks, tracker):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.tracker = [tracker]  # a list, so that it is no submodule

    def forward(self, x):
        out = self.blocks(x)
        if self.tracker[0] is not None:
            self.tracker[0].keep_output(out)
        return out


def make_blocks(first, count, ac):
    """Blocks first .. first + count - 1, seeded by index so every layout has the same weights."""
    blocks = []
    for i in range(first, first + count):
        torch.manual_seed(i)
        blocks.append(Block(ac))
    return blocks


def loss_fn(out, target):
    return out.mean()  # saves no tensor, so the last rank's count is the blocks' alone


def flight(schedule, m, p, r, v):
    """Stage-equivalent micro-batches in flight on rank r, as analytic.py's memory_terms says."""
    if schedule == "gpipe":
        return m
    if schedule == "interleaved":
        return min(m * v, (v - 1) * p + 2 * (p - 1 - r) + 1) / v
    return min(m, p - r)


def unit_bytes(ac):
    """One block's saved activations for one micro-batch, from a plain forward."""
    block = make_blocks(0, 1, ac)[0]
    tracker = Tracker(block.parameters())
    x = torch.randn(TOKENS, H)
    with tracker.hooks():
        y = block(x)
    peak = tracker.peak["saved"]
    del y
    return peak


def run_case(rank, schedule, ac, m):
    n_stages = P * V if schedule == "interleaved" else P
    stage_ids = [rank, rank + P] if schedule == "interleaved" else [rank]
    per_stage = LAYERS // n_stages
    tracker = Tracker([])
    stages, params = [], []
    for s in stage_ids:
        module = StageModule(make_blocks(s * per_stage, per_stage, ac), None)
        params += list(module.parameters())
        stages.append(PipelineStage(module, s, n_stages, torch.device("cpu")))
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}[
        schedule
    ]
    sched = cls(
        stages if schedule == "interleaved" else stages[0], n_microbatches=m, loss_fn=loss_fn
    )
    torch.manual_seed(1234)
    x, target = torch.randn(m * TOKENS, H), torch.zeros(m * TOKENS, H)
    args = (x,) if rank == 0 else ()
    kwargs = {"target": target, "losses": []} if rank == P - 1 else {}
    sched.step(*args, return_outputs=False, **kwargs)  # first step: shapes are inferred, p2p set up
    tracker.skip = {p.untyped_storage().data_ptr() for p in params}
    for st in stages:
        st.submod.tracker[0] = tracker
    dist.barrier()
    with tracker.hooks():
        sched.step(*args, return_outputs=False, **kwargs)
    left = dict(tracker.now)  # all freed by the step's end, or something leaked
    return {"saved": tracker.peak["saved"], "all": tracker.peak["all"], "left": left}


def worker(rank, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # 4 processes on a 2-core machine
    dist.init_process_group("gloo", rank=rank, world_size=P)
    rows = []
    for m in MICRO:
        for ac in (False, True):
            for schedule in SCHEDULES:
                got = run_case(rank, schedule, ac, m)
                rows.append({"schedule": schedule, "ac": ac, "m": m, "rank": rank, **got})
    queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def main():
    units = {ac: unit_bytes(ac) for ac in (False, True)}
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=worker, args=(r, port, queue)) for r in range(P)]
    for proc in procs:
        proc.start()
    rows = [row for _ in procs for row in queue.get()]
    for proc in procs:
        proc.join()
        assert proc.exitcode == 0
    rows.sort(key=lambda x: (x["m"], x["ac"], SCHEDULES.index(x["schedule"]), x["rank"]))
    layers_per_rank = LAYERS // P
    for row in rows:
        unit = units[row["ac"]]
        row["saved_units"] = row["saved"] / unit
        row["all_units"] = row["all"] / unit
        row["formula_units"] = layers_per_rank * flight(
            row["schedule"], row["m"], P, row["rank"], V
        )
    commit = subprocess.run(
        ["git", "-C", str(Path(__file__).resolve().parents[2]), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    meta = {
        "torch": torch.__version__,
        "command": "PYTHONPATH=src python3 benchmarks/cpu/pp_schedule_memory.py",
        "commit": commit,
        "p": P,
        "v": V,
        "layers": LAYERS,
        "hidden": H,
        "tokens_per_microbatch": TOKENS,
        "unit_bytes": {"no_ac": units[False], "ac": units[True]},
    }
    lines = [
        "# Saved activations per pipeline rank under torch's schedules (CPU, gloo)",
        "",
        f"torch {meta['torch']}, commit {commit}, command `{meta['command']}`.",
        f"p = {P}, {LAYERS} blocks (2 a rank), h = {H}, {TOKENS} rows a micro-batch, fp32; "
        f"unit = one block's saved activations for one micro-batch: "
        f"{units[False]:,} B without AC, {units[True]:,} B with full AC.",
        "`saved` = peak live autograd-saved bytes; `+outputs` also counts stage outputs kept in "
        "PipelineStage.fwd_cache; `formula` = stage layers on the rank x flight (analytic.py).",
        "",
        "| m | AC | schedule | rank | saved bytes | saved (units) | +outputs (units) | formula (units) |",
        "|---|----|----------|------|-------------|---------------|------------------|-----------------|",
    ]
    for row in rows:
        lines.append(
            f"| {row['m']} | {'on' if row['ac'] else 'off'} | {row['schedule']} | {row['rank']} "
            f"| {row['saved']:,} | {row['saved_units']:.2f} | {row['all_units']:.2f} "
            f"| {row['formula_units']:.2f} |"
        )
    leaks = [r for r in rows if any(r["left"].values())]
    lines += ["", f"Bytes still live after a step (should be none): {leaks or 'none'}"]
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "result.md").write_text(text)
    (OUT / "result.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
