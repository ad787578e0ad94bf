"""The commands a user types, in subprocesses."""

import os
import socket
import subprocess
import sys

import pytest
from conftest import RECIPES, make_mnist_dir, read_result, run_cli

from paratrain.cli import main

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def test_demo_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = run_cli(["demo", "--max-steps", "60", "--output-dir", out], timeout=300)
    assert "paratrain demo:" in proc.stdout and "results in" in proc.stdout
    result = read_result(out)
    s = result["summary"]
    assert result["world_size"] == 2 and result["strategy"] == "ddp-ds" and result["data_real"]
    assert s["optimizer_steps"] == 60
    # 60 steps x 64 digits of a small CNN: far above the 10% of guessing
    assert s["val_accuracy"] > 0.5, s


def test_run_under_outside_torchrun(tmp_path, tiny_overrides):
    out = tmp_path / "tr"
    run_cli(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "paratrain",
            "run",
            *tiny_overrides,
            "--set",
            "strategy=ddp-ds",
            "--set",
            "train.max_steps=5",
            "--set",
            "data.batch_size=16",
            "--output-dir",
            out,
        ],
        module="torch.distributed.run",
    )
    result = read_result(out)
    assert result["world_size"] == 2 and result["summary"]["optimizer_steps"] == 5
    # it joined the job torchrun made instead of launching its own
    assert not (out / "config.yaml").read_text().count("nproc: 2")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_inside_a_slurm_step(tmp_path, tiny_overrides):
    """What srun does for `srun -n 2 paratrain run ...`: start 2 tasks with SLURM's variables."""
    out = tmp_path / "slurm"
    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NTASKS="2",
            SLURM_NTASKS_PER_NODE="2",
            SLURM_JOB_NODELIST="127.0.0.1",
            SLURM_JOB_ID="1",
            MASTER_PORT=port,
            OMP_NUM_THREADS="1",
        )
        cmd = [
            sys.executable,
            "-m",
            "paratrain",
            "run",
            *tiny_overrides,
            "--set",
            "strategy=ddp-ds",
            "--set",
            "train.max_steps=4",
            "--set",
            "data.batch_size=16",
            "--output-dir",
            str(out),
        ]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    result = read_result(out)
    assert result["world_size"] == 2 and "torchrun" not in outputs[0]


def test_missing_mnist_files_fail_before_any_worker_starts(tmp_path):
    proc = run_cli(
        [
            "run",
            "--set",
            "data.source=mnist",
            "--set",
            f"data.path={tmp_path}",
            "--set",
            "strategy=ddp-ds",
            "--nproc",
            "2",
            "--set",
            "device=cpu",
        ],
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "train-images-idx3-ubyte" in proc.stderr
    assert "Traceback" not in proc.stderr and "torchrun" not in proc.stdout


def test_mnist_idx_recipe_runs(tmp_path):
    make_mnist_dir(tmp_path / "mnist", n_train=256, n_test=64)
    out = tmp_path / "run"
    run_cli(
        [
            "run",
            RECIPES / "mnist_mobilenetv2.yaml",
            "--set",
            f"data.path={tmp_path / 'mnist'}",
            "--set",
            "data.image_size=32",
            "--set",
            "data.batch_size=16",
            "--set",
            "data.num_workers=1",
            "--set",
            "train.max_steps=3",
            "--set",
            "device=cpu",
            "--set",
            "log.progress=false",
            "--nproc",
            "2",
            "--output-dir",
            out,
        ]
    )
    result = read_result(out)
    assert (
        result["config"]["model"]["name"] == "mobilenet_v2"
        and result["summary"]["optimizer_steps"] == 3
    )


def run_here(capsys, *args):
    """`paratrain ARGS` in this process, for a mistake found before anything starts (the
    process-level view of the same, its whole stderr one line, is the MNIST test above):
    -> (exit code, stderr)."""
    capsys.readouterr()
    code = main([*map(str, args)])
    return code, capsys.readouterr().err


def test_missing_text_data_fails_before_any_worker_starts(tmp_path, capsys):
    code, err = run_here(
        capsys,
        *("run", RECIPES / "tiny_lora_cpu.yaml", "--set", "data.source=alpaca"),
        *("--set", f"data.path={tmp_path / 'nope.json'}", "--nproc", "2"),
    )
    assert code == 2 and err.count("\n") == 1 and "data.path: no such file" in err, err


def test_fused_kernels_off_cuda_fail_before_any_worker_starts(tmp_path, capsys):
    out = tmp_path / "run"
    code, err = run_here(
        capsys,
        *("run", RECIPES / "tiny_lora_cpu.yaml", "--set", "model.kernels=liger-loss"),
        *("--nproc", "2", "--output-dir", out),
    )
    assert (
        code == 2
        and err.count("\n") == 1
        and "model.kernels: liger-loss runs Triton kernels on CUDA GPUs" in err
        and not out.exists()
    ), err
