import os
from pathlib import Path

import pytest

from paratrain.launch.torchrun import (
    LaunchConfig,
    first_slurm_host,
    launched_by_torchrun,
    slurm_rank_env,
    torchrun_argv,
)


def test_torchrun_detection():
    assert launched_by_torchrun({"TORCHELASTIC_RUN_ID": "x"})
    assert launched_by_torchrun({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert not launched_by_torchrun({"RANK": "0"})


def test_slurm_tasks_become_ranks():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_NODELIST": "gpu[003-004]",
        "SLURM_NTASKS_PER_NODE": "4(x2)",
    }
    out = slurm_rank_env(env)
    assert out["RANK"] == "5" and out["WORLD_SIZE"] == "8" and out["LOCAL_RANK"] == "1"
    assert out["LOCAL_WORLD_SIZE"] == "4" and out["MASTER_PORT"] == "21234"
    assert out["MASTER_ADDR"] == "gpu003"


def test_single_task_slurm_is_not_a_job_of_ranks():
    assert slurm_rank_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None
    assert slurm_rank_env({}) is None


def test_first_slurm_host_forms():
    assert first_slurm_host("node7") == "node7"
    assert first_slurm_host("gpu[12,15-16],cpu1") == "gpu12"


def test_torchrun_argv_single_node_is_standalone():
    argv = torchrun_argv(LaunchConfig(), 4, Path("c.yaml"))
    assert "--standalone" in argv and "--nproc-per-node=4" in argv
    assert argv[-3:] == ["-m", "paratrain.worker", "c.yaml"]


def test_torchrun_argv_multi_node_uses_c10d():
    cfg = LaunchConfig(nnodes=2, node_rank=1, rdzv_endpoint="head:29400", max_restarts=3)
    argv = torchrun_argv(cfg, 8, Path("c.yaml"))
    assert "--standalone" not in argv
    assert {
        "--nnodes=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=head:29400",
        "--max-restarts=3",
    } <= set(argv)
    # the arguments are torchrun's own: its parser accepts them
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(argv)
    assert args.nnodes == "2" and args.rdzv_endpoint == "head:29400" and args.module
    # c10d numbers the nodes as they join and ignores --node-rank (torchrun warns so)
    assert not any(a.startswith("--node-rank") for a in argv)


def test_numa_affinity_is_torchruns_own_binding_and_needs_a_gpu(tmp_path):
    from paratrain.config import load_config
    from paratrain.errors import UserError
    from paratrain.runner import preflight
    from paratrain.runplan import resolve

    argv = torchrun_argv(LaunchConfig(numa_affinity="node"), 8, Path("c.yaml"))
    assert "--numa-binding=node" in argv
    assert not any(a.startswith("--numa") for a in torchrun_argv(LaunchConfig(), 8, Path("c")))
    # torchrun itself reads it (torch >= 2.9): the flag we pass is one it has
    from torch.distributed.run import get_args_parser

    parsed = get_args_parser().parse_args([*argv[:-3], "-m", "x"])
    assert str(parsed.numa_binding).endswith("node")
    cfg = load_config(
        None,
        ["device=cpu", "strategy=ddp-ds", "launch.numa_affinity=node", f"output_dir={tmp_path}"],
    )
    with pytest.raises(UserError, match="launch.numa_affinity: binds each rank near its GPU"):
        preflight(resolve(cfg))


@pytest.mark.parametrize(
    ("settings", "libraries"),
    [
        (["model.name=tiny_cnn"], ()),  # mnist-sample and a CNN of its own: no torchvision
        (["model.name=mobilenet_v2"], ("torchvision",)),
        (["model.name=tiny_cnn", "data.source=mnist", "data.path=/nowhere"], ("torchvision",)),
        (
            ["data.source=synthetic-text", "model.shape=tiny", "model.init=random"],
            ("transformers", "peft"),
        ),
        (
            ["task=masked_lm", "model.shape=tiny-bert", "model.init=random"]
            + ["data.source=python-docs", "data.max_length=64"],
            ("transformers.modeling_utils", "transformers.tokenization_utils_fast"),
        ),
    ],
)
def test_the_fork_server_imports_what_the_run_needs(monkeypatch, settings, libraries):
    """The workers' fork server imports the run's libraries once, and only those: an import
    the run never makes costs every launch its time (torchvision's ~1.5 s of CPU)."""
    from paratrain.config import load_config
    from paratrain.runner import worker_imports
    from paratrain.runplan import resolve

    monkeypatch.delenv("PARATRAIN_FORKSERVER", raising=False)
    plan = resolve(load_config(None, ["device=cpu", "strategy=ddp-ds", *settings]))
    base = ("paratrain.worker", "paratrain.trainer.trainer", "torch._inductor.config")
    assert worker_imports(plan) == (*base, *libraries)


def test_threads_a_process_keep_a_set_omp_num_threads(monkeypatch):
    from paratrain.config.launch import LaunchConfig
    from paratrain.distributed.host import cores
    from paratrain.launch.torchrun import threads_per_process

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads_per_process(LaunchConfig(), 2) == 3  # the environment's, as PyTorch keeps it
    assert threads_per_process(LaunchConfig(cpu_threads=5), 2) == 5  # the setting wins
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert threads_per_process(LaunchConfig(), 1) == cores()
    monkeypatch.setenv("OMP_NUM_THREADS", "many")  # not a count: as unset
    assert threads_per_process(LaunchConfig(), 1) == cores()


@pytest.mark.parametrize("forked", [True, False])
def test_the_workers_python_imports_nothing_from_the_working_directory(
    tmp_path, monkeypatch, forked
):
    """A numpy.py in the folder the user runs from (a handed run folder's) is not imported in
    place of numpy by a launch's workers: the fork server starts as `python -c`, a worker as
    `python -m`, and both would put the working directory first on sys.path. The agent is
    stood in for by one that starts both kinds of process, as its own would, in the
    environment the launch gives them."""
    import os
    import subprocess
    import sys

    from paratrain.launch import torchrun as launch

    marker = tmp_path / "it-ran"
    (tmp_path / "numpy.py").write_text(f"import os\nos.makedirs({str(marker)!r})\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    started = []

    lib = tmp_path / "lib"  # a module to run with -m, found elsewhere, importing numpy
    lib.mkdir()
    (lib / "a_worker.py").write_text("import numpy\n")

    def workers(*_):
        started.append(os.environ.get("PYTHONSAFEPATH"))
        env = {**os.environ, "PYTHONPATH": str(lib)}
        for how in (["-c", "import numpy"], ["-m", "a_worker"]):
            subprocess.run([sys.executable, *how], check=True, capture_output=True, env=env)

    if forked:  # paratrain's forked workers: torch's launcher with a fork server
        monkeypatch.setattr(
            "torch.distributed.launcher.api.elastic_launch", lambda **_: lambda arg: workers()
        )
        monkeypatch.setattr(
            "multiprocessing.forkserver._forkserver._stop", lambda: None, raising=False
        )
    else:  # torchrun's own: `python -m` workers
        monkeypatch.setattr("torch.distributed.run.run", workers)
    argv = torchrun_argv(LaunchConfig(), 2, Path("plan.json"))
    launch.run_torchrun(argv, preload=("json",) if forked else ())
    assert started == ["1"] and not marker.exists()
    assert "PYTHONSAFEPATH" not in os.environ  # this process's own, as it was


NATIVE_WARNING = """
import os, sys
from datetime import timedelta
from paratrain.launch.torchrun import quiet_native_log
quiet_native_log(verbose=sys.argv[1] == "verbose")
assert "TORCH_CPP_LOG_LEVEL" not in os.environ  # what the command starts keeps the user's
import torch.distributed as dist
server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=2))
del server  # the store's host gone, as a node's whose rank failed
try:
    client.get("x")
except Exception as e:
    print(type(e).__name__)
"""


def test_the_commands_native_log_is_quiet_and_its_children_keep_the_users():
    """c10d's warning of a lost store (a C++ stack of ~30 frames) is not printed by the
    command's process; under --verbose it is; the variable is not left for its children."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    said = {
        how: subprocess.run(
            [sys.executable, "-c", NATIVE_WARNING, how],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        for how in ("quiet", "verbose")
    }
    assert all(p.returncode == 0 and "DistNetworkError" in p.stdout for p in said.values()), said
    assert "TCPStore.cpp" in said["verbose"].stderr  # the warning this hides, shown
    assert "TCPStore.cpp" not in said["quiet"].stderr and "frame #" not in said["quiet"].stderr


def test_the_command_loads_torch_only_after_its_native_log_is_set():
    """quiet_native_log must run before torch loads: importing the CLI loads none of it."""
    import subprocess
    import sys

    code = "import sys, paratrain.cli; print('torch' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr[-2000:]
