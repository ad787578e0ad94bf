"""Nothing good is lost across resumes: pruning (checkpoint.keep) keeps to the run's own line of
checkpoints and never removes the one just written; resuming from an older checkpoint starts a
new line and keeps the later ones aside, where `--resume DIR` never picks them; `--resume DIR`
finds the run's checkpoints wherever checkpoint.dir put them; checkpoint.resume=auto with
nothing to resume is a fresh run, refused where an earlier run is."""

import shutil

from conftest import RECIPES, one_error_line

from paratrain.checkpoint import integrity, list_checkpoints
from paratrain.cli import main

TINY = str(RECIPES / "tiny_cpu.yaml")
QUICK = ["strategy=single", "log.progress=false", "log.every_steps=1"]


def sets(*settings):
    return [a for s in [*QUICK, *settings] for a in ("--set", s)]


def run(out, *settings, flags=()):
    return main(["run", TINY, *sets(*settings), "--output-dir", str(out), *flags])


def resume(target, *settings):
    return main(["run", "--resume", str(target), *sets(*settings)])


def names(folder):
    return [c.name for c in list_checkpoints(folder)]


def test_pruning_after_a_fallback_keeps_what_is_good(tmp_path, capsys):
    """The newest checkpoint is damaged: the run resumes from the one before, and keep=1
    leaves the checkpoint it just wrote (was: only the damaged one, nothing good left)."""
    out = tmp_path / "run"
    assert run(out, "train.max_steps=8", "checkpoint.every_steps=2") == 0
    ckpts = out / "checkpoints"
    shard = ckpts / "step_00000008" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    assert resume(out, "checkpoint.keep=1", "train.max_steps=7") == 0
    said = capsys.readouterr().out
    assert "checkpoint skipped: step_00000008" in said and "step_00000006 at step 6" in said
    assert "later ones (step_00000008) are kept in" in said
    good = list_checkpoints(ckpts)
    assert good[-1].name == "step_00000007" and integrity.problem(good[-1]) is None
    assert [p.name for p in (ckpts / "aside").rglob("step_00000008")] == ["step_00000008"]
    assert resume(out, "train.max_steps=9") == 0
    assert "step_00000007 at step 7" in capsys.readouterr().out


def test_resuming_an_older_checkpoint_branches_and_resume_dir_follows_the_branch(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(out, "train.max_steps=8", "checkpoint.every_steps=2", "checkpoint.keep=0") == 0
    ckpts = out / "checkpoints"
    old = {c.name: (c / "manifest.json").read_bytes() for c in list_checkpoints(ckpts)}
    # back to step 4 with another learning rate, trained to 6
    assert resume(ckpts / "step_00000004", "train.lr=0.05", "train.max_steps=6") == 0
    said = capsys.readouterr().out
    assert "later ones (step_00000006, step_00000008) are kept in" in said
    assert names(ckpts) == ["step_00000002", "step_00000004", "step_00000006"]
    branch = integrity.owner(ckpts / "step_00000006")
    trunk = integrity.owner(ckpts / "step_00000004")
    assert branch["lineage"] != trunk["lineage"] and branch["parent"] == [trunk["lineage"], 4]
    kept = {c.name: (c / "manifest.json").read_bytes() for c in (ckpts / "aside").rglob("step_*")}
    assert kept == {k: v for k, v in old.items() if k in ("step_00000006", "step_00000008")}
    # the run folder goes on from the branch just trained, not the abandoned step 8
    assert resume(out, "train.max_steps=9") == 0
    assert "step_00000006 at step 6" in capsys.readouterr().out


def test_resume_of_a_run_folder_finds_checkpoints_in_its_checkpoint_dir(tmp_path, capsys):
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    assert run(out, "train.max_steps=4", f"checkpoint.dir={elsewhere}") == 0
    assert resume(out, "train.max_steps=6") == 0  # what the Ctrl-C line says to run
    assert f"resumed from {elsewhere / 'step_00000004'} at step 4" in capsys.readouterr().out


def test_resume_auto_into_a_finished_folder_without_checkpoints_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(out, "train.max_steps=2", "checkpoint.at_end=false") == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert run(out, "train.max_steps=3", "checkpoint.resume=auto") == 2
    one_error_line(capsys, f"{out} holds an earlier run")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_resume_of_a_finished_run_with_its_recipe_says_finished(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(out, "train.max_steps=2") == 0
    said = capsys.readouterr().out
    assert f"paratrain: plan (saved as {out / 'plan.json'} after step 1)" in said
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    recipe = copy / "config.yaml"
    assert main(["run", str(recipe), "--resume", str(copy)]) == 0
    assert "is a finished run (2 steps" in capsys.readouterr().out
    assert main(["run", "--resume", str(copy)]) == 0  # without the recipe: the same
    assert "is a finished run (2 steps" in capsys.readouterr().out
