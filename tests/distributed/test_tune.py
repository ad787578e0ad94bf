"""`paratrain tune` on the CPU over a planted space: a batch of 32 runs far more samples/s than
the recipe's 8 (the per-step overhead of a tiny CNN), and a learning rate of 1e-8 is as fast but
does not learn. The search must pick batch 32 with the recipe's learning rate, show lr=1e-8 as
failing the numerics guard, write a recipe that reads back, and a second tune must resume from
the results DB without running anything."""

import json
import subprocess
import sys

import pytest

from paratrain.cli import main
from paratrain.config import load_config

pytestmark = pytest.mark.dist

SPACE = """levers:
  - {key: data.batch_size, values: [8, 32]}
  - {key: train.lr, values: [0.002, 1.0e-8]}
"""


def tune(tmp_path, *extra):
    # 80 steps: a measured window of about a second, not the 0.25 s that 24 gave, which one
    # moment of a loaded machine (three test workers on two cores) could halve
    cmd = [
        sys.executable, "-m", "paratrain", "tune", "recipes/tiny_cpu.yaml",
        "--space", str(tmp_path / "space.yaml"), "--steps", "80", "--no-progress",
        "--db", str(tmp_path / "tune.db"), "--out", str(tmp_path / "tune"),
        "--set", "data.batch_size=8", "--set", "train.warmup_steps=5", "--loss-band", "0.02",
        *extra,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400)


def test_tune_finds_the_planted_best_and_resumes(tmp_path):
    (tmp_path / "space.yaml").write_text(SPACE)
    first = tune(tmp_path, "--budget", "10m")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    found = json.loads((tmp_path / "tune" / "tune.json").read_text())
    trials = {t["label"]: t for t in found["trials"]}
    frozen = "data.batch_size=32, train.lr=1e-08"
    assert set(trials) == {"the recipe", "data.batch_size=32", frozen}
    best = next(t for t in found["trials"] if t["index"] == found["best"])
    assert best["label"] == "data.batch_size=32"
    assert trials["data.batch_size=32"]["throughput"] > trials["the recipe"]["throughput"]
    assert trials[frozen]["status"] == "numerics", trials[frozen]
    tuned = load_config(tmp_path / "tune" / "tuned.yaml")
    assert tuned.data.batch_size == 32 and tuned.train.lr == 0.002
    assert "paratrain tune" in first.stdout and "(best)" in first.stdout

    again = tune(tmp_path, "--budget", "1s")  # no time to run anything: every trial stored
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    second = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert all(t["reused"] for t in second["trials"])
    assert second["best"] == found["best"]


def test_tune_refuses_bad_input_once(tmp_path, capsys):
    (tmp_path / "space.yaml").write_text("levers: []\n")
    base = ["tune", "recipes/tiny_cpu.yaml", "--out", str(tmp_path / "tune")]
    cases = ((["--budget", "soon"], "--budget"), (["--space", str(tmp_path / "space.yaml")],
             "expected levers"), (["--keep", "precision", "--space", str(tmp_path / "none.yaml")],
             "--space"))  # fmt: skip
    for args, says in cases:
        assert main([*base, *args]) == 2
        err = capsys.readouterr().err
        assert err.count("error") == 1 and says in err and "Traceback" not in err
    assert not (tmp_path / "tune").exists()
