"""Bad user input through `paratrain run`, bounded: each case feeds one user mistake (a corrupt
data file, a wrong key, a folder that is a file, a checkpoint that does not fit, ...) to
`python3 -m paratrain run <recipe> --nproc 2 --set ...` (2 CPU gloo processes) and records

- the exit code (expected 2),
- how often the one line `paratrain: error: ...` was printed, stdout and stderr together
  (expected exactly once),
- whether a Python traceback appeared (expected none),
- whether the files that existed before (a run folder's config.yaml, its checkpoints, a file
  given as a folder) are byte-identical afterwards (sha256 before / after; expected untouched).

Every case makes its bad data in a temporary folder of its own, and is bounded by --timeout
(default 120 s; its whole process group is killed after that). Two short good runs are made
first: an image run with two checkpoints (copied for the cases that resume into it or damage it)
and nothing else. Standard library only; paratrain is used through its command line.

    python3 benchmarks/chaos/bad_input.py --out benchmarks/results/<date>-cpu/bad_input.md
    python3 benchmarks/chaos/bad_input.py --only lr_nan,corrupt_png   # a few cases

Prints the table as it goes, then the command and the relevant output lines of every case that
is not ok; --out writes the same as markdown.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import hashlib
import os
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMG_RECIPE = str(ROOT / "recipes" / "tiny_cpu.yaml")
LM_RECIPE = str(ROOT / "recipes" / "tiny_lora_cpu.yaml")
IMG = ["log.progress=false", "train.max_steps=4", "data.num_workers=0"]
LM = ["log.progress=false", "train.max_steps=2", "data.max_length=32", "data.num_workers=0"]
ERROR_LINE = "paratrain: error:"
TRACEBACK = "Traceback (most recent call last)"


# --------------------------------------------------------------------------- bad data, made here


def png_bytes(side: int, value: int) -> bytes:
    """A valid grayscale PNG (8-bit, one value everywhere), written with zlib only."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    raw = b"".join(b"\x00" + bytes([value]) * side for _ in range(side))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def idx_images(n: int, data_images: int | None = None) -> bytes:
    """IDX3 (MNIST images) whose header says n images of 28x28; data_images < n: a truncated
    file (the header promises more than is there)."""
    body = bytes((i * 7) % 256 for i in range(28 * 28)) * (
        n if data_images is None else data_images
    )
    return struct.pack(">IIII", 0x00000803, n, 28, 28) + body


def idx_labels(n: int) -> bytes:
    return struct.pack(">II", 0x00000801, n) + bytes(i % 10 for i in range(n))


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# --------------------------------------------------------------------------- running and watching


@dataclass
class Setup:
    """What a case runs: the arguments after `paratrain run`, extra environment, the paths whose
    files must be left as they are, and a note for the table."""

    args: list[str]
    what: str
    env: dict[str, str] = field(default_factory=dict)
    watch: list[Path] = field(default_factory=list)
    cwd: Path | None = None
    skip: str | None = None
    after: Callable[[], str] | None = None
    """Called after the run: a short extra note (e.g. a stray folder it left)."""


@dataclass
class Outcome:
    name: str
    exit: str
    lines: int | str
    traceback: bool | str
    untouched: bool | None | str
    ok: bool | str
    secs: float
    command: str = ""
    what: str = ""
    changed: list[str] = field(default_factory=list)
    diff: list[str] = field(default_factory=list)
    note: str = ""
    log: str = ""


def snapshot(paths: list[Path]) -> dict[str, tuple[str, str | None]]:
    """Every file under the given paths (files or folders), by path: its sha256, and its text
    when it is a small YAML / JSON / text file (for a diff when it changed)."""
    out = {}
    for p in paths:
        files = (
            [p]
            if p.is_file()
            else sorted(f for f in p.rglob("*") if f.is_file())
            if p.is_dir()
            else []
        )
        for f in files:
            data = f.read_bytes()
            text = None
            if f.suffix in (".yaml", ".json", ".txt", "") and len(data) < 65536:
                text = data.decode(errors="replace")
            out[str(f)] = (hashlib.sha256(data).hexdigest(), text)
    return out


def changes(before: dict, after: dict) -> tuple[list[str], list[str]]:
    """-> (files changed or removed, a unified diff of the changed text files)."""
    changed, diff = [], []
    for p, (digest, text) in before.items():
        if p not in after:
            changed.append(f"{p} (removed)")
        elif after[p][0] != digest:
            changed.append(f"{p} (changed)")
            if text is not None and after[p][1] is not None:
                diff += difflib.unified_diff(
                    text.splitlines(),
                    after[p][1].splitlines(),
                    f"{p} before",
                    f"{p} after",
                    lineterm="",
                    n=1,
                )
    return changed, diff


def sets(*items: str) -> list[str]:
    """--set flags; a later key=value replaces an earlier one of the same key."""
    merged = {item.split("=", 1)[0]: item for item in items}
    return [a for s in merged.values() for a in ("--set", s)]


def paratrain(args: list[str], env: dict[str, str], cwd: Path | None, timeout: float):
    """-> (exit code or None on timeout, stdout+stderr interleaved, seconds). The command runs
    in its own session; on a timeout its whole process group (torchrun's agent and workers) is
    killed."""
    cmd = [sys.executable, "-m", "paratrain", "run", *args]
    t = time.perf_counter()
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd or ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        start_new_session=True,
    )
    try:
        out, _ = p.communicate(timeout=timeout)
        code = p.returncode
    except subprocess.TimeoutExpired:
        with _quiet():
            os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        code = None
    return code, out, time.perf_counter() - t


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, kind, *_):
        return kind is not None and issubclass(kind, ProcessLookupError)


def display(args: list[str], env: dict[str, str], cwd: Path | None) -> str:
    """The command as typed in the repository root (or in `cwd`)."""
    if cwd is None:
        args = [a.removeprefix(f"{ROOT}{os.sep}") for a in args]
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in env.items())
    where = f"cd {shlex.quote(str(cwd))} && " if cwd else ""
    return f"{where}{prefix}python3 -m paratrain run {shlex.join(args)}"


def relevant(log: str, limit: int = 40) -> list[str]:
    """The lines a developer needs: every `paratrain:` line, and of each traceback its first
    line, paratrain's last frame, the last frame and the exception. A worker's lines carry torchrun's `[rankN]: ` and
    interleave with the other ranks': each rank's lines are read on their own."""
    lines = log.splitlines()
    streams: dict[str, list[int]] = {}
    bare = []
    for i, line in enumerate(lines):
        m = re.match(r"\[(rank\d+|default\d*)\]:", line)
        streams.setdefault(m.group(1) if m else "", []).append(i)
        bare.append(line[m.end() :] if m else line)
    keep: set[int] = set()
    for idx in streams.values():
        for n, i in enumerate(idx):
            if "paratrain:" in bare[i] and "torchrun --nproc" not in bare[i]:
                keep.add(i)
            if TRACEBACK not in bare[i]:
                continue
            keep.add(i)
            m = n + 1
            while m < len(idx) and (
                bare[idx[m]].startswith((" ", "\t")) or not bare[idx[m]].strip()
            ):
                m += 1
            frames = [k for k in range(n + 1, m) if bare[idx[k]].lstrip().startswith("File ")]
            keep.update(idx[k] for k in range(frames[-1] if frames else n, min(m + 1, len(idx))))
            ours = [k for k in frames if "/paratrain/" in bare[idx[k]]]
            if ours:  # where it left paratrain's code: that frame and its source line
                keep.update(idx[k] for k in range(ours[-1], min(ours[-1] + 2, m)))
    picked = [lines[i] for i in sorted(keep) if not set(bare[i].strip()) <= {"^", "~"}]
    if len(picked) > limit:
        picked = picked[: limit - 1] + [f"... ({len(picked) - limit + 1} more lines)"]
    return picked


def evaluate(name: str, s: Setup, timeout: float) -> Outcome:
    command = display(s.args, s.env, s.cwd)
    if s.skip:
        return Outcome(
            name, "-", "-", "-", "not simulated", "n/a", 0.0, command, s.what, note=s.skip
        )
    before = snapshot(s.watch)
    code, log, secs = paratrain(s.args, s.env, s.cwd, timeout)
    changed, diff = changes(before, snapshot(s.watch))
    lines = log.count(ERROR_LINE)
    tb = TRACEBACK in log
    untouched = None if not before else not changed
    exit_ = "timeout" if code is None else str(code)
    ok = code == 2 and lines == 1 and not tb and untouched is not False
    note = s.after() if s.after else ""
    return Outcome(
        name, exit_, lines, tb, untouched, ok, secs, command, s.what, changed, diff, note, log
    )


# --------------------------------------------------------------------------- the cases


def img(out: Path, *settings: str, extra: tuple[str, ...] = ()) -> list[str]:
    """`paratrain run` arguments: the tiny image recipe on 2 processes, into `out`."""
    return [IMG_RECIPE, "--nproc", "2", *sets(*IMG, *settings), "--output-dir", str(out), *extra]


def lm(out: Path, *settings: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The same with the tiny LoRA Llama recipe."""
    return [LM_RECIPE, "--nproc", "2", *sets(*LM, *settings), "--output-dir", str(out), *extra]


class Cases:
    """One method per case: makes the bad input under its own folder, returns a Setup."""

    def __init__(self, work: Path, good_image_run: Path):
        self.work = work
        self.good = good_image_run  # a finished image run: config.yaml, checkpoints step 2 and 4
        self.src = os.environ.get("PYTHONPATH", "")
        self._cleanups: list[Callable[[], None]] = []

    def folder(self, name: str) -> Path:
        d = self.work / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def run_copy(self, d: Path) -> Path:
        """A copy of the good image run, to damage or resume into."""
        dst = d / "old_run"
        shutil.copytree(self.good, dst)
        config = dst / "config.yaml"  # its own folder's, as if it had been run there
        config.write_text(config.read_text().replace(str(self.good), str(dst)))
        return dst

    def cleanup(self) -> None:
        for fn in self._cleanups:
            with _quiet_all():
                fn()

    # ---- the recipe and --set values (refused before anything starts)
    def recipe_missing(self, d: Path) -> Setup:
        args = [str(d / "no_such_recipe.yaml"), "--nproc", "2", "--output-dir", str(d / "out")]
        return Setup(args, "a recipe file that does not exist")

    def recipe_bad_yaml(self, d: Path) -> Setup:
        bad = write(d / "bad.yaml", "task: image_classification\ntrain: [lr: 0.1\n  epochs: 2\n")
        args = [str(bad), "--nproc", "2", "--output-dir", str(d / "out")]
        return Setup(args, "a recipe that is not valid YAML (an unclosed [)")

    def unknown_key(self, d: Path) -> Setup:
        return Setup(img(d / "out", "train.lrr=0.01"), "--set train.lrr=0.01 (no such key)")

    def wrong_type(self, d: Path) -> Setup:
        return Setup(img(d / "out", "data.batch_size=many"), "--set data.batch_size=many (an int)")

    def lr_nan(self, d: Path) -> Setup:
        return Setup(img(d / "out", "train.lr=nan"), "--set train.lr=nan")

    def lr_inf(self, d: Path) -> Setup:
        return Setup(img(d / "out", "train.lr=inf"), "--set train.lr=inf")

    # ---- data the workers read
    def corrupt_idx(self, d: Path) -> Setup:
        m = d / "mnist"
        write(m / "train-images-idx3-ubyte", idx_images(64, data_images=10))  # truncated
        write(m / "train-labels-idx1-ubyte", idx_labels(64))
        write(m / "t10k-images-idx3-ubyte", idx_images(16))
        write(m / "t10k-labels-idx1-ubyte", idx_labels(16))
        return Setup(
            img(d / "out", "data.source=mnist", f"data.path={m}", "data.batch_size=4"),
            "data.source=mnist; train-images-idx3-ubyte's header says 64 images, the file holds "
            "10 (truncated); the other three IDX files valid",
        )

    def invalid_json(self, d: Path) -> Setup:
        bad = write(d / "data.json", '[{"instruction": "Say hi", "output": "hi"},\n {"inst')
        return Setup(
            lm(d / "out", "data.source=alpaca", f"data.path={bad}"),
            "data.source=alpaca, data.path a .json file cut off mid-record",
        )

    def invalid_jsonl(self, d: Path) -> Setup:
        good = '{"instruction": "Say hi", "output": "hi"}\n'
        bad = write(d / "data.jsonl", good * 10 + '{"instruction": "x", "output": \n' + good * 10)
        return Setup(
            lm(d / "out", "data.source=alpaca", f"data.path={bad}"),
            "data.source=alpaca, data.path a .jsonl whose line 11 is broken JSON",
        )

    def jsonl_missing_fields(self, d: Path) -> Setup:
        bad = write(d / "data.jsonl", '{"question": "Say hi", "answer": "hi"}\n' * 20)
        return Setup(
            lm(d / "out", "data.source=alpaca", f"data.path={bad}"),
            "data.source=alpaca, a .jsonl whose rows have question/answer, not instruction/output",
        )

    def batch_larger_than_data(self, d: Path) -> Setup:
        return Setup(
            img(d / "out", "data.limit_samples=16", "data.batch_size=64"),
            "data.limit_samples=16 with data.batch_size=64 on 2 ranks",
        )

    def corrupt_png(self, d: Path) -> Setup:
        root = d / "images"
        for c, cls in enumerate(("cat", "dog")):
            for i in range(8):
                write(root / cls / f"{i}.png", png_bytes(28, 40 + 150 * c + i))
        full = (root / "cat" / "0.png").read_bytes()
        write(root / "cat" / "0.png", full[: len(full) // 2])  # cut mid-IDAT
        settings = [
            "data.source=imagefolder",
            f"data.path={root}",
            "data.val_fraction=0",
            "data.image_size=28",
            "data.batch_size=2",
            "train.max_steps=null",
            "train.epochs=1",
        ]
        return Setup(
            img(d / "out", *settings),
            "data.source=imagefolder, 16 PNGs in 2 classes, one cut in half (every image is read "
            "in the one epoch)",
        )

    # ---- the user's own model builder
    def builder_raises(self, d: Path) -> Setup:
        write(
            d / "pkg" / "bad_builder.py",
            "def build(num_classes, in_channels):\n"
            "    raise RuntimeError('my builder: no weights at /nonexistent/weights.pt')\n",
        )
        return Setup(
            img(d / "out", "model.name=bad_builder:build"),
            "model.name=bad_builder:build, a builder that raises RuntimeError",
            env={"PYTHONPATH": f"{d / 'pkg'}{os.pathsep}{self.src}"},
        )

    def builder_syntax_error(self, d: Path) -> Setup:
        write(d / "pkg" / "typo_builder.py", "def build(num_classes, in_channels)\n    return 1\n")
        return Setup(
            img(d / "out", "model.name=typo_builder:build"),
            "model.name=typo_builder:build, a module with a syntax error (a missing colon)",
            env={"PYTHONPATH": f"{d / 'pkg'}{os.pathsep}{self.src}"},
        )

    # ---- folders
    def checkpoint_dir_is_file(self, d: Path) -> Setup:
        f = write(d / "a_file", "keep me\n")
        return Setup(
            img(d / "out", f"checkpoint.dir={f}"), "checkpoint.dir an existing file", watch=[f]
        )

    def output_dir_is_file(self, d: Path) -> Setup:
        f = write(d / "a_file", "keep me\n")
        return Setup(img(f), "output_dir an existing file", watch=[f])

    def output_dir_unwritable(self, d: Path) -> Setup:
        locked = d / "locked"
        keep = write(locked / "keep.txt", "keep me\n")
        args = img(locked / "run")
        what = "output_dir under a folder root cannot write into (chattr +i: immutable)"
        # root passes every permission check (chmod does not stop it); an immutable folder does
        chattr = shutil.which("chattr")
        made = chattr and subprocess.run([chattr, "+i", str(locked)], capture_output=True)
        if not made or made.returncode:
            return Setup(args, what, skip="chattr +i failed here: not simulated")
        self._cleanups.append(lambda: subprocess.run([chattr, "-i", str(locked)], check=False))
        return Setup(args, what, watch=[keep])

    def fresh_run_into_other_run(self, d: Path) -> Setup:
        old = self.run_copy(d)
        return Setup(
            img(old),
            "a fresh run (no resume) with output_dir a finished run's folder (its checkpoints)",
            watch=[old],
        )

    def fresh_run_into_run_without_checkpoints(self, d: Path) -> Setup:
        old = self.run_copy(d)
        shutil.rmtree(old / "checkpoints")
        return Setup(
            img(old),
            "a fresh run (no resume) with output_dir a finished run's folder without checkpoints "
            "(config.yaml, plan.json, result.json, steps.jsonl, TensorBoard events)",
            watch=[old],
        )

    def first_batch_png_into_folder(self, d: Path) -> Setup:
        root = d / "images"
        for c, cls in enumerate(("cat", "dog")):
            for i in range(8):
                full = png_bytes(28, 40 + 150 * c + i)
                write(root / cls / f"{i}.png", full[: len(full) // 2])  # cut mid-IDAT
        out = d / "out"
        # a folder with a config.yaml alone holds no run (a bench run's folder starts so): the
        # run may go there, and writes nothing before its first step has run
        recipe = write(out / "config.yaml", Path(IMG_RECIPE).read_text())
        settings = [
            "data.source=imagefolder",
            f"data.path={root}",
            "data.image_size=28",
            "data.batch_size=2",
        ]

        def left() -> str:
            new = sorted(p.name for p in out.iterdir() if p != recipe)
            return f"left in the folder: {', '.join(new)}" if new else ""

        return Setup(
            img(out, *settings),
            "data.source=imagefolder, every PNG cut in half (the first batch fails), into a "
            "folder holding a config.yaml alone: nothing written there",
            watch=[out],
            after=left,
        )

    def fresh_run_checkpoint_dir_other_run(self, d: Path) -> Setup:
        old = self.run_copy(d)
        cwd = self.folder(f"{d.name}/cwd")
        return Setup(
            [IMG_RECIPE, "--nproc", "2", *sets(*IMG, f"checkpoint.dir={old / 'checkpoints'}")],
            "a fresh run, default output_dir, checkpoint.dir another run's checkpoints folder",
            watch=[old],
            cwd=cwd,
            after=lambda: _stray(cwd),
        )

    # ---- checkpoints
    def resume_missing(self, d: Path) -> Setup:
        old = self.run_copy(d)
        nowhere = old / "checkpoints" / "step_00000099"
        return Setup(
            img(old, "train.max_steps=6", extra=("--resume", str(nowhere))),
            "continue a run (its own output_dir) with --resume naming a checkpoint folder that "
            "does not exist",
            watch=[old],
        )

    def resume_truncated(self, d: Path) -> Setup:
        old = self.run_copy(d)
        ck = old / "checkpoints" / "step_00000004"
        truncate(ck / "__0_0.distcp")
        return Setup(
            img(old, "train.max_steps=6", extra=("--resume", str(ck))),
            "continue a run (its own output_dir) with --resume naming its step_4 checkpoint, "
            "whose __0_0.distcp was cut in half",
            watch=[old],
        )

    def resume_auto_all_damaged(self, d: Path) -> Setup:
        old = self.run_copy(d)
        for ck in sorted((old / "checkpoints").glob("step_*")):
            truncate(ck / "__0_0.distcp")
        return Setup(
            img(old, "train.max_steps=6", "checkpoint.resume=auto"),
            "checkpoint.resume=auto into a run whose two checkpoints both have __0_0.distcp cut "
            "in half",
            watch=[old],
        )

    def resume_other_model(self, d: Path) -> Setup:
        ck = self.good / "checkpoints" / "step_00000004"
        return Setup(
            lm(d / "out", extra=("--resume", str(ck))),
            "the LoRA LM recipe (new output_dir) resumed from the image run's (tiny_cnn) "
            "checkpoint",
            watch=[self.good],
        )


class _quiet_all:
    def __enter__(self):
        return self

    def __exit__(self, kind, *_):
        return kind is not None and issubclass(kind, Exception)


def _stray(cwd: Path) -> str:
    made = sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*") if p.is_file())
    return f"left {', '.join(made)}" if made else ""


CASES = [
    "recipe_missing",
    "recipe_bad_yaml",
    "unknown_key",
    "wrong_type",
    "lr_nan",
    "lr_inf",
    "corrupt_idx",
    "invalid_json",
    "invalid_jsonl",
    "jsonl_missing_fields",
    "batch_larger_than_data",
    "corrupt_png",
    "builder_raises",
    "builder_syntax_error",
    "checkpoint_dir_is_file",
    "output_dir_is_file",
    "output_dir_unwritable",
    "fresh_run_into_other_run",
    "fresh_run_into_run_without_checkpoints",
    "first_batch_png_into_folder",
    "fresh_run_checkpoint_dir_other_run",
    "resume_missing",
    "resume_truncated",
    "resume_auto_all_damaged",
    "resume_other_model",
]


# --------------------------------------------------------------------------- the report


def cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def row(o: Outcome) -> str:
    ok = "ok" if o.ok is True else "NOT OK" if o.ok is False else o.ok
    note = o.note.replace("|", "\\|")
    return (
        f"| {o.name} | {o.exit} | {o.lines} | {cell(o.traceback)} | {cell(o.untouched)} | {ok} "
        f"| {o.secs:.0f} | {note} |"
    )


HEAD = (
    "| case | exit | lines | traceback | untouched | ok | s | note |\n"
    "|---|---|---|---|---|---|---|---|"
)


def details(outcomes: list[Outcome]) -> str:
    parts = []
    for o in outcomes:
        if o.ok is not False:
            continue
        why = []
        if o.exit != "2":
            why.append(f"exit {o.exit}")
        if o.lines != 1:
            why.append(f"the error line printed {o.lines} times")
        if o.traceback:
            why.append("a traceback")
        if o.untouched is False:
            why.append("files changed")
        text = "\n".join(relevant(o.log)) or "(no paratrain line, no traceback)"
        changed = "".join(f"- {c}\n" for c in o.changed)
        diff = "\n".join(o.diff)
        parts.append(
            f"### {o.name}: {', '.join(why)}\n\n{o.what}.\n\n```\n{o.command}\n```\n\n"
            + (f"Changed:\n\n{changed}\n" if changed else "")
            + (f"```diff\n{diff}\n```\n\n" if diff else "")
            + f"Output (the relevant lines):\n\n```\n{text}\n```\n"
        )
    return "\n".join(parts)


def good_run(out: Path, timeout: float) -> None:
    """The finished image run the checkpoint cases use: 4 steps, checkpoints at 2 and 4."""
    code, log, _ = paratrain(img(out, "checkpoint.every_steps=2"), {}, None, timeout)
    found = sorted((out / "checkpoints").glob("step_*")) if out.is_dir() else []
    if code != 0 or [p.name for p in found] != ["step_00000002", "step_00000004"]:
        raise SystemExit(f"the good image run failed (exit {code}):\n{log[-3000:]}")


def versions() -> tuple[str, str]:
    def out(cmd):
        try:
            return subprocess.run(
                cmd, capture_output=True, text=True, cwd=ROOT, timeout=60
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "?"

    commit = out(["git", "rev-parse", "--short", "HEAD"]) or "?"
    tracked = out(["git", "ls-files", str(Path(__file__).resolve().relative_to(ROOT))])
    if commit != "?" and not tracked:
        commit += " (this script not yet committed)"
    torch = out([sys.executable, "-c", "import torch; print(torch.__version__)"]) or "?"
    return commit, torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the table (markdown) here; default: print only")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per case (default 120)")
    ap.add_argument(
        "--budget", type=float, default=900, help="seconds for all cases; the rest are skipped"
    )
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument(
        "--keep", action="store_true", help="keep the temporary folder (data, run folders, logs)"
    )
    a = ap.parse_args()
    names = a.only.split(",") if a.only else CASES
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")

    t0 = time.perf_counter()
    started = datetime.datetime.now().astimezone()
    commit, torch_version = versions()
    work = Path(tempfile.mkdtemp(prefix="bad-input-"))
    good = work / "good_image_run"
    good_run(good, max(a.timeout, 180))
    cases = Cases(work, good)
    outcomes: list[Outcome] = []
    print(HEAD, flush=True)
    try:
        for name in names:
            if time.perf_counter() - t0 > a.budget:
                o = Outcome(name, "-", "-", "-", "-", "skipped", 0.0, note="over --budget")
            else:
                setup = getattr(cases, name)(cases.folder(name))
                o = evaluate(name, setup, a.timeout)
                if o.ok is False:
                    write(work / "logs" / f"{name}.log", o.log)
            outcomes.append(o)
            print(row(o), flush=True)
    finally:
        cases.cleanup()
    total = time.perf_counter() - t0
    n_ok = sum(o.ok is True for o in outcomes)
    n_bad = sum(o.ok is False for o in outcomes)
    summary = (
        f"{len(outcomes)} cases: {n_ok} ok, {n_bad} not ok, "
        f"{len(outcomes) - n_ok - n_bad} not run or not simulated; {total:.0f} s in all"
    )
    print(f"\n{summary}\n")
    text = details(outcomes)
    if text:
        print(text)
    if a.out:
        argv = " ".join(shlex.quote(x) for x in sys.argv[1:])
        header = (
            f"# Bad user input through `paratrain run` ({started:%Y-%m-%d %H:%M %Z})\n\n"
            f"- command: `python3 benchmarks/chaos/bad_input.py {argv}`\n"
            f"- commit {commit}, torch {torch_version}, Python {sys.version.split()[0]}, "
            f"{os.cpu_count()} CPU cores; each case `python3 -m paratrain run <recipe> --nproc 2 ...` "
            f"(2 gloo processes), timeout {a.timeout:.0f} s\n"
            "- expected for every case: exit 2, the line `paratrain: error: ...` printed exactly "
            "once (lines), no `Traceback (most recent call last)`, and the files that existed "
            "before (watched: a run folder's config.yaml and checkpoints, a file given as a "
            "folder) byte-identical afterwards (untouched; `-`: nothing existed to watch)\n\n"
        )
        cases_list = "".join(f"- `{o.name}`: {o.what}\n" for o in outcomes if o.what)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(
            header
            + f"{summary}\n\n{HEAD}\n"
            + "\n".join(row(o) for o in outcomes)
            + "\n\n"
            + f"## The cases\n\n{cases_list}\n"
            + (f"## Not ok: commands and output\n\n{text}" if text else "")
        )
        print(f"written to {a.out}")
    if a.keep:
        print(f"work folder (data, run folders, logs of the cases not ok): {work}")
    elif n_bad:
        _drop_all_but_logs(work)
        print(f"full logs of the cases not ok: {work / 'logs'}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _drop_all_but_logs(work: Path) -> None:
    for p in work.iterdir():
        if p.name != "logs":
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


if __name__ == "__main__":
    raise SystemExit(main())
