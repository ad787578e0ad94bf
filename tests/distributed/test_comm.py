"""`paratrain comm` on 2 CPU processes (gloo), through torchrun's agent."""

import json

import pytest
from conftest import run_cli

from paratrain.cli import main

pytestmark = pytest.mark.dist


def test_comm_times_every_collective_on_two_processes(tmp_path):
    out = tmp_path / "comm"
    args = ["comm", "--nproc", "2", "--device", "cpu", "--dtype", "fp32", "--max-bytes", "8K"]
    # without OMP_NUM_THREADS, as in a user's shell: torchrun's banner about it is not printed
    more = ["--iters", "2", "--warmup", "1", "--passes", "2", "--out", out]
    proc = run_cli(args + more, unset=("OMP_NUM_THREADS",))
    assert "OMP_NUM_THREADS" not in proc.stdout + proc.stderr, proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["backend"] == "gloo" and result["world_size"] == 2 and result["passes"] == 2
    rows = result["rows"]
    assert {r["op"] for r in rows} == {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "all_to_all",
    }
    assert sorted({r["bytes"] for r in rows}) == [1024, 2048, 4096, 8192]
    assert all(r["time_us"] > 0 and r["busbw_gbps"] > 0 for r in rows)
    ar = next(r for r in rows if r["op"] == "all_reduce")
    assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"])  # 2(n-1)/n = 1 for n = 2
    assert "busbw GB/s" in proc.stdout
    assert (out / "busbw.png").read_bytes()[:4] == b"\x89PNG"


def test_comm_bad_input_is_one_line_exit_2(tmp_path, capsys):
    """Each mistake is found before any process starts: one as the user meets it (a process
    of its own, whose whole stderr is the one line), the others in this process."""
    out = tmp_path / "comm"
    proc = run_cli(["comm", "--device", "cpu", "--ops", "all_sum", "--out", out], check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--ops: got ['all_sum']" in proc.stderr
    for bad, message in (
        (["--nproc", "1"], "--nproc: a collective needs at least 2 processes"),
        (["--max-bytes", "lots"], "expected a size"),
    ):
        capsys.readouterr()
        assert main(["comm", "--device", "cpu", *bad, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_doctor_all_reduce_rows_through_comms_code():
    """doctor's all-reduce rows (taken on machines with several GPUs) on 2 gloo processes: the
    same launch and result.json as `paratrain comm`, the sizes doctor keeps."""
    from paratrain.doctor.measure import all_reduce

    rows = all_reduce(2, "cpu", quick=True)
    assert [r["bytes"] for r in rows] == [2**20, 4 * 2**20]  # 1 MiB and the CPU's largest
    assert all(r["kind"] == "all_reduce" and r["value"] > 0 for r in rows)
    assert rows[0]["name"] == "all_reduce 1 MiB x2 (gloo)"
