"""A run folder is a file people hand each other: what its own .paratrain/ records say is taken
only inside the folder, through no link; nothing of a user's is removed by --overwrite, pruning
or a resume that is refused; --resume DIR follows the line just trained."""

import json
import os

import pytest
from conftest import RECIPES, one_error_line

from paratrain.checkpoint import list_checkpoints
from paratrain.cli import main
from paratrain.launch.runfolder import ledger, overwrite
from paratrain.trainer import faults

TINY = str(RECIPES / "tiny_cpu.yaml")
QUICK = ["strategy=single", "log.progress=false", "log.every_steps=1"]


def run(out, *settings, flags=()):
    args = [a for s in [*QUICK, *settings] for a in ("--set", s)]
    return main(["run", TINY, *args, "--output-dir", str(out), *flags])


def resume(target, *settings):
    return main(["run", "--resume", str(target), *[a for s in settings for a in ("--set", s)]])


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-step run with checkpoints at 2 and 4."""
    out = tmp_path_factory.mktemp("handed") / "run"
    assert run(out, "train.max_steps=4", "checkpoint.every_steps=2") == 0
    return out


def copy_of(src, dst):
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst


def edit_ledger(out, **changes):
    path = out / ledger.LEDGER
    body = json.loads(path.read_text())
    body.update(changes)
    path.write_text(json.dumps(body))


def test_a_ledger_naming_files_outside_its_folder_moves_none_of_them(finished, tmp_path):
    out = copy_of(finished, tmp_path / "run")
    precious = tmp_path / "precious.txt"
    precious.write_text("mine")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "precious.txt").write_text("mine too")
    os.symlink(tmp_path / "shared", out / "shared")
    files = json.loads((out / ledger.LEDGER).read_text())["files"]
    edit_ledger(out, files=[*files, "../precious.txt", str(precious), "shared/precious.txt"])
    assert run(out, "train.max_steps=3", flags=["--overwrite"]) == 0
    assert precious.read_text() == "mine"
    assert (tmp_path / "shared" / "precious.txt").read_text() == "mine too"


def test_a_handed_record_of_an_overwrite_moves_and_removes_nothing_outside(finished, tmp_path):
    """A handed folder ships a record of an unfinished --overwrite naming files outside it,
    and a checkpoints/aside/overwritten that is a link to the user's folder: resuming it,
    refused or not, neither removes nor moves anything there."""
    out = copy_of(finished, tmp_path / "handed")
    home = tmp_path / "home"
    (home / "Documents").mkdir(parents=True)
    (home / "Documents" / "letter.txt").write_text("mine")
    (home / "precious.txt").write_text("mine")
    edit_ledger(out, files=["../home/precious.txt"])
    aside = out / overwrite.OVERWRITTEN
    (aside / "files" / "checkpoints" / "..").mkdir(parents=True, exist_ok=True)
    (aside / "files" / "numpy.py").write_text("raise SystemExit('imported')\n")
    (out / "checkpoints" / "aside").mkdir()
    os.symlink(home, out / "checkpoints" / "aside" / "overwritten")
    record = {
        "files": ["../home/precious.txt", "checkpoints/../../numpy.py", "../numpy.py"],
        "checkpoints": ["Documents", "../Documents", "step_00000004"],
        "ckpt_dir": str(out / "checkpoints"),
    }
    (aside / "record.json").write_text(json.dumps(record))
    before = {p: p.read_bytes() for p in home.rglob("*") if p.is_file()}
    for settings in (["train.max_steps=4"], ["train.max_steps=6"]):  # refused, then trained
        resume(out, *settings)
    assert {p: p.read_bytes() for p in home.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "numpy.py").exists() and not (home / "numpy.py").exists()


def test_overwrite_of_a_run_without_its_list_of_files_is_refused(finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path / "run")
    (out / ledger.LEDGER).unlink()  # copied without its dot-files
    (out / "tensorboard" / "notes.md").write_text("mine")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert run(out, "train.max_steps=3", flags=["--overwrite"]) == 2
    one_error_line(capsys, "without the list of the files it wrote")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_the_ledger_lists_only_the_names_a_run_writes(tmp_path):
    out = tmp_path / "run"
    (out / "tensorboard").mkdir(parents=True)
    ledger.start(out, "r1", new_session=True)
    (out / "tensorboard" / "events.out.tfevents.1.host").write_text("x")
    (out / "tensorboard" / "notes.md").write_text("mine, written during the run")
    (out / "samples").mkdir()
    (out / "samples" / "epoch_0.png").write_text("x")
    (out / "samples" / "mine.png").write_text("mine")
    ledger.record(out)
    assert ledger.read(out)["files"] == [
        "samples/epoch_0.png",
        "tensorboard/events.out.tfevents.1.host",
    ]


def test_pruning_leaves_a_users_file_in_a_checkpoint_folder(tmp_path):
    out = tmp_path / "run"
    assert run(out, "train.max_steps=2", "checkpoint.every_steps=1", "checkpoint.keep=0") == 0
    (out / "checkpoints" / "step_00000001" / "notes.txt").write_text("mine")
    assert resume(out, "train.max_steps=4", "checkpoint.keep=1") == 0
    assert (out / "checkpoints" / "step_00000001" / "notes.txt").read_text() == "mine"
    assert [c.name for c in list_checkpoints(out / "checkpoints")] == ["step_00000004"]


def test_an_overwrite_whose_command_was_killed_is_put_back_by_the_next_command(
    finished, tmp_path, capsys
):
    out = copy_of(finished, tmp_path / "run")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    from paratrain.launch.runfolder import earlier_run

    # what a killed --overwrite leaves: its earlier run set aside, nothing after
    overwrite.set_aside(out, out / "checkpoints", earlier_run(out, out / "checkpoints"))
    assert not (out / "result.json").exists()
    capsys.readouterr()
    assert resume(out, "train.max_steps=4") == 2  # finished: nothing to train, refused
    assert "an --overwrite that did not finish left the earlier run aside; put back" in (
        capsys.readouterr().out
    )
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_refused_resume_of_an_older_checkpoint_moves_nothing_aside(finished, tmp_path):
    out = copy_of(finished, tmp_path / "run")
    ckpts = out / "checkpoints"
    assert resume(ckpts / "step_00000002", "train.max_steps=2") == 2  # nothing to train
    assert [c.name for c in list_checkpoints(ckpts)] == ["step_00000002", "step_00000004"]


def test_resume_dir_of_a_finished_run_goes_on_with_the_branch_trained_since(
    finished, tmp_path, capsys
):
    out = copy_of(finished, tmp_path / "run")
    ckpts = out / "checkpoints"
    faults._FAULTS = faults.parse("raise:step=4")
    try:  # back to step 2, saved at 3, failed after step 4
        with pytest.raises(RuntimeError):
            resume(ckpts / "step_00000002", "train.max_steps=6", "checkpoint.every_steps=1")
    finally:
        faults._FAULTS = []
    capsys.readouterr()
    assert resume(out, "train.max_steps=6") == 0
    assert "step_00000004 at step 4" in capsys.readouterr().out  # the branch's, not "finished"


def test_pruning_spares_another_runs_checkpoints_in_a_shared_checkpoint_dir(tmp_path):
    shared = tmp_path / "ckpts"
    assert (
        run(
            tmp_path / "a",
            "train.max_steps=4",
            "checkpoint.every_steps=2",
            f"checkpoint.dir={shared}",
        )
        == 0
    )
    theirs = [c.name for c in list_checkpoints(shared)]
    b = [f"checkpoint.dir={shared}", "checkpoint.resume=auto", "checkpoint.keep=1"]
    assert run(tmp_path / "b", "train.max_steps=6", "checkpoint.every_steps=2", *b) == 0
    assert set(theirs) <= {c.name for c in list_checkpoints(shared)}


def test_a_checkpoint_dir_inside_another_run_folder_is_refused(finished, tmp_path, capsys):
    a = copy_of(finished, tmp_path / "a")
    before = {p: p.read_bytes() for p in a.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert run(tmp_path / "b", "train.max_steps=2", f"checkpoint.dir={a}") == 2
    one_error_line(capsys, f"lies in the run folder {a} of another run")
    assert {p: p.read_bytes() for p in a.rglob("*") if p.is_file()} == before
