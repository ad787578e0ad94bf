"""Room for checkpoints (checkpoint/room.py): a save that fails on a full disk is one line
naming the folder, the bytes needed and free, exit 2, its unfinished folder removed and the
checkpoint before it whole; before step 1, a checkpoint folder that cannot be written or has
no room for one checkpoint is one line, exit 2, nothing written."""

import contextlib
import errno
import io
import shutil
from pathlib import Path

import pytest
from conftest import RECIPES, one_error_line

from paratrain.checkpoint import integrity, list_checkpoints, room
from paratrain.cli import main

TINY = str(RECIPES / "tiny_cpu.yaml")
QUICK = ["strategy=single", "log.progress=false", "train.eval=false", "checkpoint.every_steps=2"]


def run(out, *settings, flags=()):
    args = [a for s in [*QUICK, *settings] for a in ("--set", s)]
    return main(["run", TINY, *args, "--output-dir", str(out), *flags])


def snapshot(folder: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def full_at_step_4(tmp_path_factory):
    """A 6-step run whose disk fills while step 4's checkpoint is written (DCP's writer gets
    ENOSPC, as on a full tmpfs) -> (its folder, its exit code, its stderr)."""
    from torch.distributed.checkpoint import FileSystemWriter

    out = tmp_path_factory.mktemp("room") / "run"
    write = FileSystemWriter.write_data

    def full(self, plan, planner):
        if "step_00000004" in str(self.path):
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        return write(self, plan, planner)

    err = io.StringIO()  # (a module's fixture has no capsys)
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err):
        mp.setattr(FileSystemWriter, "write_data", full)
        code = run(out, "train.max_steps=6")
    return out, code, err.getvalue()


def test_a_full_disk_during_a_save_is_one_line_and_the_checkpoint_before_stays(full_at_step_4):
    out, code, err = full_at_step_4
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    folder = out / "checkpoints"
    assert err.startswith(
        f"paratrain: error: checkpoint.dir: step 4's checkpoint not saved in {folder}: No space "
        "left on device (it needs about "
    ), err
    assert " free); step_00000002 is kept; free some space" in err, err
    assert [p.name for p in folder.iterdir()] == ["step_00000002"]  # no .step_*.tmp left
    assert integrity.problem(folder / "step_00000002") is None  # whole: it resumes


def test_a_checkpoint_folder_that_cannot_be_written_is_refused_before_step_1(
    full_at_step_4, tmp_path, capsys
):
    """A run resumed from a checkpoint it can read into a run folder whose checkpoints/ it
    cannot write (was: found at the first save, with a traceback)."""
    out = tmp_path / "run"
    shutil.copytree(full_at_step_4[0], out)
    shutil.rmtree(out / "checkpoints")
    # a checkpoints/ this user cannot write, root included (who writes through any mode
    # bits): the folder under /sys
    (out / "checkpoints").symlink_to("/sys")
    source = full_at_step_4[0] / "checkpoints" / "step_00000002"
    before = snapshot(out)
    resume = ["--set", f"checkpoint.resume={source}", "--set", "train.max_steps=8"]
    assert main(["run", str(out / "config.yaml"), *resume, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"checkpoint.dir: cannot write into {out / 'checkpoints'}" in err, err
    assert snapshot(out) == before


def test_no_room_for_the_resumed_checkpoints_size_is_refused_before_step_1(
    full_at_step_4, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "run"
    shutil.copytree(full_at_step_4[0], out)
    newest = list_checkpoints(out / "checkpoints")[-1]
    need = room.folder_bytes(newest)
    monkeypatch.setattr(room, "free_bytes", lambda folder: need // 2)
    before = snapshot(out)
    assert main(["run", "--resume", str(out), "--set", "train.max_steps=8"]) == 2
    line = one_error_line(capsys, "a checkpoint (as step_00000002) needs about")
    assert f"checkpoint.dir: {out / 'checkpoints'} has {room.size(need // 2)} free" in line
    assert snapshot(out) == before


def test_no_room_for_one_checkpoint_of_a_fresh_run_is_refused_before_step_1(
    tmp_path, capsys, monkeypatch
):
    """The model built, its weights and its optimizer's moments counted: more than the folder
    has (said before any step; the run folder the launch made is gone again)."""
    monkeypatch.setattr(room, "free_bytes", lambda folder: 1000)
    out = tmp_path / "fresh"
    assert run(out, "train.max_steps=2") == 2
    one_error_line(capsys, "has 1000 B free and one checkpoint of this model and its optimizer")
    assert not out.exists()
