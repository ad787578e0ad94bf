"""Checkpoints on torch.distributed.checkpoint (DCP): every rank writes its own shards, and a
checkpoint loads into any layout.

A checkpoint is a folder `step_<N>/`: DCP's files for the model and optimizer state (as
torch.distributed.checkpoint.state_dict gives them: DTensor shards under FSDP and tensor
parallelism, a pipeline stage's own parameters, one copy of what DDP replicates; optimizer state
flattened per parameter name, so the stages' parts never collide), plus train_state.pt (loop
position, loss scaler, the layout that wrote it) and one rng_rank<r>.pt per rank. Loading reads
the tensors this rank's layout needs, resharding as it goes (DCP's planner): a 2 x 2 FSDP x TP
run resumes on the same mesh, on another, or in one process. A model with frozen weights (LoRA)
saves only what trains: the base is rebuilt from its source on resume, and an 8B model's 16 GB
need not be rewritten every N steps.

The folder is written under a temporary name and renamed once every rank has finished: a
rename is atomic on POSIX, so a crash leaves the previous checkpoint or the new one, never half.
`read_checkpoint` turns one into plain tensors in one process (tests, inspection, export).
A manifest of checksums is its last file, and loading runs no code from it (integrity.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import shutil
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from paratrain.checkpoint import integrity, room, schema
from paratrain.errors import UserError


@dataclass
class LoopState:
    """Where the loop is; saved with the weights so a resumed run continues at the same step."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    samples_in_epoch: int = 0
    """Samples of this epoch's order already trained on (over all data-parallel ranks): a run
    resumed with another data-parallel size skips the same samples."""
    bad_steps: list = field(default_factory=list)
    """Steps skipped for a non-finite loss or gradient (train.max_bad_steps)."""
    losses: dict = field(default_factory=dict)
    """The run's losses before this step, for the result of a run resumed here: the finished
    epochs' records and each rank's loss sum of this epoch so far (trainer/losses.py)."""


_NAME = re.compile(r"step_(\d+)$")
_TRAIN_STATE = "train_state.pt"


def step_of(checkpoint: Path) -> int:
    """The step a checkpoint folder's name says (step_<N>)."""
    return int(_NAME.fullmatch(checkpoint.name).group(1))


def checkpoint_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}"


def list_checkpoints(directory: str | Path) -> list[Path]:
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted(
        p for p in d.iterdir() if _NAME.fullmatch(p.name) and (p / _TRAIN_STATE).is_file()
    )


def resolve_resume(path: str | Path, own: Path | None = None) -> Path | None:
    """A checkpoint folder, a checkpoints folder, a run folder, or `auto` (this run's own
    checkpoint folder `own`) -> the checkpoint to load: the one named, or the newest good one
    (each rank checks a share of the files against the manifest; one that fails is named and
    the one before it tried). None: `auto` and no checkpoint yet. Collective."""
    if str(path) == "auto":
        found = list_checkpoints(own) if own is not None else []
        return _newest_good(found, own) if found else None
    p = Path(path)
    if (p / _TRAIN_STATE).is_file() or (p / integrity.MANIFEST).is_file():
        bad = _problem(p)
        if bad:
            raise UserError(f"checkpoint.resume: {bad}")
        return p
    if p.is_file() and p.suffix == ".pt":
        raise UserError(
            f"checkpoint.resume: {p} is a single-file checkpoint of an earlier paratrain; this "
            "one reads torch.distributed.checkpoint folders (step_*/). Its tensors still load "
            "with torch.load(path)['model']"
        )
    # a run folder's own checkpoints/ first: checkpoint folders of others beside them (a
    # checkpoint.dir pointed at it) are not the run's
    for d in (p / "checkpoints", p):
        found = list_checkpoints(d)
        if found:
            return _newest_good(found, d)
    raise UserError(f"checkpoint.resume: no checkpoint (step_*/ with {_TRAIN_STATE}) at {p}")


def _problem(folder: Path) -> str | None:
    """integrity.problem over all ranks, each hashing its share of the files."""
    rank, world = _rank_world()
    found = integrity.problem(folder, (rank, world))
    problems = [found]
    if dist.is_initialized():
        problems = [None] * world
        dist.all_gather_object(problems, found)
    return next((x for x in problems if x), None)


def _newest_good(found: list[Path], where: Path) -> Path:
    skipped = []
    for candidate in reversed(found):
        bad = _problem(candidate)
        if bad is None:
            if skipped and _rank_world()[0] == 0:
                for note in skipped:
                    print(f"paratrain: checkpoint skipped: {note}", flush=True)
            return candidate
        skipped.append(bad)
    raise UserError(
        f"checkpoint.resume: no good checkpoint in {where} ({len(found)} found; newest: "
        f"{skipped[0]})"
    )


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's random streams as tensors and plain types (torch.load with
    weights_only=True reads them back)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _load_plain(path: Path, check=None) -> Any:
    """paratrain's own files of a checkpoint: tensors and plain types only (integrity.plain_file);
    check(value) -> what is wrong with its shape (schema.py), refused before anything uses it."""
    try:
        found = integrity.plain_file(path)
    except integrity.UnsafeCheckpoint as e:
        raise UserError(f"checkpoint.resume: {e}") from None
    wrong = check(found) if check is not None else None
    if wrong:
        raise UserError(f"checkpoint.resume: {path}: {wrong} (not as paratrain writes it); refused")
    return found


def _options(model: torch.nn.Module, **extra):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    frozen = any(not p.requires_grad for p in model.parameters())
    return frozen, StateDictOptions(
        ignore_frozen_params=frozen, flatten_optimizer_state_dict=True, **extra
    )


def _rank_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# DCP warns on every call without a process group that it assumes one process; here that is
# what is meant. (Also from an async save's writer thread, which a context manager would miss.)
warnings.filterwarnings("ignore", message="torch.distributed is .*single process")


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class AsyncSaves:
    """checkpoint.async_mode: the checkpoint in flight, and a gloo group of its own (the writer
    thread's collectives must not interleave with training's on the default group). Made on
    every rank (collective)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.group = None
        if mode != "none" and dist.is_initialized():
            self.group = dist.new_group(backend="gloo")

    def start(self, work) -> None:
        def run():
            try:
                work()
            except BaseException as e:  # raised in the main thread by wait()
                self.error = e

        self.thread = threading.Thread(target=run, name="paratrain-checkpoint", daemon=True)
        self.thread.start()

    def wait(self) -> None:
        """Collective: every rank's write finished, the checkpoint renamed into place."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
            _barrier()
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def close(self) -> None:
        self.wait()


def save_checkpoint(
    directory: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    state: LoopState,
    device: torch.device,
    keep: int,
    layout: dict[str, Any] | None = None,
    saves: AsyncSaves | None = None,
    replica: dict[str, Any] | None = None,
    owner: dict[str, Any] | None = None,
) -> Path:
    """Collective: every rank must call it. Returns the checkpoint's folder (with `saves` in an
    async mode, where it will be once `saves.wait()` returns). owner: the run and line of
    checkpoints it belongs to, in its manifest (integrity.owner): pruning (keep) removes only
    older checkpoints of the same line."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    background = saves is not None and saves.mode != "none"
    if background:
        saves.wait()  # one in flight: the previous checkpoint is complete before this one
    _, options = _options(model)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    rank, world = _rank_world()
    final = checkpoint_path(directory, state.step)
    tmp = final.with_name(f".{final.name}.tmp")
    # a full or read-only disk: one line (room.py); the unfinished folder removed, the
    # checkpoints before it as they were
    before = list_checkpoints(directory)
    newest = before[-1] if before else None

    def needed() -> int:
        return room.folder_bytes(newest) if newest else room.state_bytes(model_state, optim_state)

    saving = functools.partial(room.saving, Path(directory), tmp, state.step, needed, newest)
    with saving():
        if rank == 0:
            for stale in Path(directory).glob(".step_*.tmp"):  # a killed run's unfinished writes
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        torch.save(rng_state(device), tmp / f"rng_rank{rank:05d}.pt")
        if replica is not None:  # sync.mode's replicas differ: this rank's own weights and state
            torch.save(replica, tmp / f"replica_rank{rank:05d}.pt")
        if rank == 0:
            torch.save(
                {
                    "loop": vars(state).copy(),
                    "scaler": scaler.state_dict() if scaler is not None else None,
                    "world_size": world,
                    "layout": layout or {},
                },
                tmp / _TRAIN_STATE,
            )
        tensors = {"model": model_state, "optimizer": optim_state}
        done = dict(tmp=tmp, final=final, directory=Path(directory), step=state.step, keep=keep)
        done["owner"] = owner or {}
        if not background:
            dcp.save(tensors, checkpoint_id=tmp, no_dist=not dist.is_initialized())
            _barrier()
            _complete(**done, group=None)
            _barrier()
            return final
        # the copy to host memory happens here, before the step may change the weights
        future = dcp.async_save(
            tensors,
            checkpoint_id=tmp,
            process_group=saves.group,
            no_dist=not dist.is_initialized(),
        )

    def finish():
        with saving():
            future.result()
            _complete(**done, group=saves.group)

    saves.start(finish)
    return final


def _complete(
    *, tmp: Path, final: Path, directory: Path, step: int, keep: int, owner: dict, group
) -> None:
    """Every rank's files written: each hashes its own; the manifest, written last, lists them
    all; the folder is renamed into place and the oldest of its line pruned."""
    rank, world = _rank_world()
    mine = integrity.digests(integrity.own_files(tmp, rank))
    listed = [mine]
    if dist.is_initialized():
        listed = [None] * world
        dist.all_gather_object(listed, mine, group=group)
    if rank == 0:
        integrity.write_manifest(tmp, step, {k: v for d in listed for k, v in d.items()}, owner)
        if final.exists():  # this line's own at this step is replaced; another's kept aside
            if integrity.owner(final).get("lineage") == owner.get("lineage"):
                remove_checkpoint(final)
            if final.exists():  # another line's, or a file of someone's in it
                set_aside(directory, [final], f"replaced-{final.name}")
        os.replace(tmp, final)
        if keep:
            prune(directory, final, keep, owner)


def prune(directory: Path, newest: Path, keep: int, owner: dict) -> None:
    """checkpoint.keep: the oldest checkpoints of `owner`'s run and line beyond `keep` removed.
    Never the one just written (`newest`), never one of another run or line (a save without an
    owner prunes only checkpoints without one)."""
    mine = {k: owner.get(k) for k in ("run", "lineage")}
    line = [
        c
        for c in list_checkpoints(directory)
        if {k: integrity.owner(c).get(k) for k in mine} == mine
    ]
    for old in line[:-keep]:
        if old != newest:
            remove_checkpoint(old)


# What a checkpoint folder holds, as paratrain and DCP write it (integrity.own_files): what
# removing one removes. A file of anyone else's in it stays, and so does the folder then.
_CHECKPOINT_FILES = (
    "__*_*.distcp",
    ".metadata",
    "train_state.pt",
    "rng_rank*.pt",
    "replica_rank*.pt",
    integrity.MANIFEST,
    f".{integrity.MANIFEST}.tmp",
)


def remove_checkpoint(folder: Path) -> None:
    """A checkpoint's own files removed, then its folder if that leaves it empty."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return
    for pattern in _CHECKPOINT_FILES:
        for path in folder.glob(pattern):
            if path.is_file() or path.is_symlink():
                path.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()


ASIDE = "aside"
"""<checkpoint folder>/aside/: checkpoints no --resume picks (a branch left behind, one of
another line that a save would have replaced), kept, never pruned."""


def set_aside(directory: Path, checkpoints: list[Path], why: str) -> Path:
    """Checkpoints moved into <directory>/aside/<time>-<why>/ -> that folder."""
    import time

    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{why}"
    folder, n = Path(directory) / ASIDE / name, 1
    while folder.exists():  # twice in a second: a folder each, nothing replaced
        n += 1
        folder = folder.with_name(f"{name}-{n}")
    folder.mkdir(parents=True)
    for c in checkpoints:
        os.replace(c, folder / c.name)
    return folder


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    device: torch.device,
    layout: dict[str, Any] | None = None,
    aliases: dict[str, list[str]] | None = None,
) -> tuple[LoopState, dict[str, Any]]:
    """Loads into this rank's layout (whatever wrote it) -> (loop state, the writer's layout
    and world size). Random number streams continue only where the writer had the same
    processes in the same layout (`layout`: this run's, as save_checkpoint records it): a rank
    then has the same role, and a tensor-parallel group's ranks keep one stream.

    aliases: {parameter name: other names of the same weight} (a tied lm_head); a writer
    holding the weight once (one process, DDP, FSDP) kept its optimizer state under one name,
    which a pipeline's last stage then reads for its copy."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(path)
    unsafe = integrity.unsafe_metadata(path)
    if unsafe:
        raise UserError(f"checkpoint.resume: {unsafe}")
    # its shape checked before the weights change: a refused file leaves the model as it was
    shape = functools.partial(schema.train_state_problem, loop_state=LoopState)
    train_state = _load_plain(path / _TRAIN_STATE, shape)
    frozen, options = _options(model)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    optim_state, renamed = _aliased(optim_state, aliases or {}, integrity.checkpoint_keys(path))
    _check_keys(path, model_state, optim_state)
    wanted = {"model": model_state, "optimizer": optim_state}
    planner, _ = integrity.safe_planners()
    try:
        with integrity.unwrapped():
            dcp.load(
                wanted,
                storage_reader=integrity.safe_reader(path),
                planner=planner(),
                no_dist=not dist.is_initialized(),
            )
    except integrity.UnsafeCheckpoint as e:
        raise UserError(f"checkpoint.resume: {path}: {e}") from None
    except Exception as e:  # DCP names the first tensor it could not find or read
        raise UserError(
            f"checkpoint.resume: {path} does not fit this model ({str(e).splitlines()[0][:200]})"
        ) from None
    wanted["optimizer"] = {renamed.get(k, k): v for k, v in wanted["optimizer"].items()}
    _, options = _options(model, strict=not frozen)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=wanted["model"],
        optim_state_dict=wanted["optimizer"],
        options=options,
    )
    keep_implementation(optimizer)
    if scaler is not None and train_state["scaler"] is not None:
        scaler.load_state_dict(train_state["scaler"])
    rank, world = _rank_world()
    same_roles = train_state.get("layout", {}).get("degrees") == (layout or {}).get("degrees")
    if train_state["world_size"] == world and same_roles:
        rng = _load_plain(path / f"rng_rank{rank:05d}.pt", schema.rng_problem)
        set_rng_state(rng, device)
    writer = {"world_size": train_state["world_size"], **train_state.get("layout", {})}
    return LoopState(**train_state["loop"]), writer


# How the update runs, not what it computes: this run's plan chose them for its layout (no
# fused SGD under tensor parallelism, fused on one GPU). Loading restores each param group whole,
# so a checkpoint written under another layout would bring its own back and the step would hand
# a fused kernel's grad_scale / found_inf to a foreach update.
_IMPLEMENTATION = ("fused", "foreach", "capturable", "differentiable")


def keep_implementation(optimizer) -> None:
    """The optimizer's own implementation flags (its defaults) over those a checkpoint held,
    and each parameter's step count where those flags want it: on the parameter's device for
    a fused or capturable update, else on the CPU (loading placed it by the writer's flags; a
    foreach AdamW reading a step on the GPU syncs the host for each tensor every step)."""
    for opt in optimizer if isinstance(optimizer, list) else [optimizer]:
        placed = "capturable" in opt.defaults  # torch's own (others place their step themselves)
        for group in opt.param_groups:
            for key in _IMPLEMENTATION:
                if key in opt.defaults:
                    group[key] = opt.defaults[key]
            if not placed:
                continue
            on_device = group.get("fused") or group.get("capturable")
            for p in group["params"]:
                step = opt.state.get(p, {}).get("step")
                if isinstance(step, torch.Tensor):
                    where = p.device if on_device else torch.device("cpu")
                    opt.state[p]["step"] = step.to(device=where, dtype=torch.float32)


def _aliased(optim_state: dict, aliases: dict, held: set) -> tuple[dict, dict]:
    """The flat optimizer state with each weight the checkpoint lacks under this name asked
    for under an alias it holds -> (that state, {asked key: this run's key})."""
    moved: dict[str, str] = {}
    for name, others in aliases.items():
        if any(k.startswith(f"optimizer.state.{name}.") for k in held):
            continue
        alias = next(
            (o for o in others if any(k.startswith(f"optimizer.state.{o}.") for k in held)), None
        )
        if alias is None:
            continue
        for key in optim_state:
            for part in ("state", "param_groups"):
                if key.startswith(f"{part}.{name}."):
                    moved[f"{part}.{alias}." + key[len(f"{part}.{name}.") :]] = key
    if not moved:
        return optim_state, {}
    back = {v: k for k, v in moved.items()}
    return {back.get(k, k): v for k, v in optim_state.items()}, moved


def _check_keys(path: Path, model_state: dict, optim_state: dict) -> None:
    """A checkpoint must hold this model's tensors, no fewer and no others (over all ranks: a
    pipeline stage has only its own), and the optimizer state of each (hyper-parameters may
    differ between torch versions and are not compared), each tensor stored as a tensor.
    Collective."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    index = integrity.checkpoint_index(path)
    held = set(index)
    want = {f"model.{k}" for k in model_state}
    want_optim = {f"optimizer.{k}" for k in optim_state if k.startswith("state.")}
    stored = {k for k in held if k.startswith("model.")}
    # A pipeline stage holds only its own layers: what no rank of this run wants is extra.
    everyone = set(want)
    if dist.is_initialized():
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, sorted(want))
        everyone = {k for keys in gathered for k in keys}

    def names(keys):
        keys = sorted(k.split(".", 1)[1] for k in keys)
        return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")

    if want - stored:
        raise UserError(
            f"checkpoint.resume: {path} lacks {len(want - stored)} of this model's tensors "
            f"({names(want - stored)})"
        )
    if stored - everyone:
        raise UserError(
            f"checkpoint.resume: {path} holds {len(stored - everyone)} tensors this model does "
            f"not have ({names(stored - everyone)}); another model, or LoRA on / off?"
        )
    if want_optim - held:
        raise UserError(
            f"checkpoint.resume: {path} lacks optimizer state for this run "
            f"({names(want_optim - held)}); written with another train.optimizer?"
        )
    # a value declared where this run has a tensor would be loaded as that value (DCP reads
    # what .metadata says), and reach the model or optimizer as something else
    mine = {f"model.{k}": v for k, v in model_state.items()}
    mine.update({f"optimizer.{k}": v for k, v in optim_state.items() if k.startswith("state.")})
    values = {
        k
        for k, v in mine.items()
        if isinstance(v, torch.Tensor) and not isinstance(index[k], TensorStorageMetadata)
    }
    if values:
        raise UserError(
            f"checkpoint.resume: {path} holds {len(values)} of this run's tensors as other "
            f"values ({names(values)}): not a checkpoint paratrain wrote; refused"
        )


def read_replica(path: str | Path, rank: int) -> dict[str, Any] | None:
    """This rank's own replica (sync.mode local_sgd / diloco / stale), where the writer kept
    one for it; tensors and plain types only."""
    file = Path(path) / f"replica_rank{rank:05d}.pt"
    return _load_plain(file) if file.is_file() else None


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint as plain tensors in this process: {"model": {name: tensor}, "optimizer":
    {flattened name: value}, "loop", "scaler", "world_size", "layout", "rng": [per rank]}.
    DCP's own converter's way (format_utils), through the planner that runs no code."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    path = Path(path)
    unsafe = integrity.unsafe_metadata(path)
    if unsafe:
        raise UserError(unsafe)
    _, empty_planner = integrity.safe_planners()
    state: dict[str, Any] = {}  # filled in place, as format_utils.dcp_to_torch_save does
    try:
        with integrity.trusted(), integrity.unwrapped():
            _load_state_dict(
                state,
                storage_reader=integrity.safe_reader(path),
                planner=empty_planner(),
                no_dist=True,
            )
    except integrity.UnsafeCheckpoint as e:
        raise UserError(f"{path}: {e}") from None
    except Exception as e:  # a shard cut short or garbled: named, not a traceback
        raise UserError(f"{path} is unreadable ({integrity.unreadable(e)})") from None
    shape = functools.partial(schema.train_state_problem, loop_state=LoopState)
    state.update(_load_plain(path / _TRAIN_STATE, shape))
    state["rng"] = [_load_plain(p) for p in sorted(path.glob("rng_rank*.pt"))]
    return state
