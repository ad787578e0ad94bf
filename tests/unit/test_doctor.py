"""`paratrain doctor`: its advice rules on recorded measurements (each can fail), and a quick
real run on this machine (the GPU rows skipped and saying so on a CPU-only one)."""

import json

from conftest import RECIPES

from paratrain.cli import main
from paratrain.doctor import advice


def gpu(i, **more):
    return {"index": i, "name": "NVIDIA H200", "numa_node": 0, "persistence": True, **more}


def found(rows, gpus=(), numa=None, cores=16):
    return {
        "facts": {
            "gpus": list(gpus),
            "numa_nodes": numa or {0: list(range(cores))},
            "cpu_cores": cores,
        },
        "measured": {"rows": rows},
    }


def copy(i, kind, value, expected=63.0):
    return {
        "name": kind,
        "value": value,
        "unit": "GB/s",
        "expected": expected,
        "gpu": i,
        "kind": kind,
    }


def test_pinned_memory_that_pays_and_that_does_not():
    paying = found([copy(0, "host->device pinned", 55.0), copy(0, "host->device pageable", 20.0)])
    (line,) = advice.pin_memory(paying)
    assert "pin_memory gives 2.8x host->device on GPU 0" in line and "keep" in line
    flat = found([copy(0, "host->device pinned", 21.0), copy(0, "host->device pageable", 20.0)])
    assert "matters little" in advice.pin_memory(flat)[0]


def test_a_slow_gpu_is_named_and_a_low_peak_flagged():
    mm = [
        {"name": "mm", "value": v, "unit": "TFLOP/s", "expected": 989.0, "gpu": i, "kind": "matmul"}
        for i, v in enumerate([700.0, 710.0, 480.0, 705.0])
    ]
    lines = advice.gpus(found(mm, gpus=[gpu(i) for i in range(4)]))
    assert len(lines) == 1 and lines[0].startswith("GPU 2 is slow: 480 TFLOP/s")
    alone = advice.gpus(found(mm[2:3], gpus=[gpu(2)]))
    assert alone and "49% of its datasheet bf16 peak" in alone[0]
    healthy = advice.gpus(found(mm[:2], gpus=[gpu(0), gpu(1)]))
    assert healthy == []


def test_a_loader_bound_recipe_and_a_loader_with_headroom():
    rows = [
        {
            "name": "loader",
            "value": 900.0,
            "unit": "samples/s",
            "kind": "loader",
            "workers": 4,
            "resize_on": "cpu",
        },
        {"name": "step", "value": 1800.0, "unit": "samples/s", "kind": "step"},
    ]
    (line,) = advice.loader(found(rows, gpus=[gpu(0)]))
    assert "900 samples/s for a 1,800 samples/s step" in line and "bottleneck" in line
    assert "raise data.num_workers (now 4; 16 cores)" in line and "data.resize_on=gpu" in line
    rows[0]["value"] = 5400.0
    assert "3.0x what the steps use: not the bottleneck" in advice.loader(found(rows))[0]


def test_a_slow_gpu_pair_and_one_without_peer_access():
    def pair(a, b, value, peer=True):
        return {
            "name": "p2p",
            "value": value,
            "unit": "GB/s",
            "kind": "p2p",
            "gpu": a,
            "peer": b,
            "peer_access": peer,
        }

    rows = [pair(0, 1, 380.0), pair(1, 0, 378.0), pair(0, 2, 375.0), pair(2, 0, 41.0)]
    (line,) = advice.peers(found(rows))
    assert line.startswith("GPU 2 -> GPU 0 copies at 41.0 GB/s") and "topo" in line
    rows[3] = pair(2, 0, 12.0, peer=False)
    assert "no peer access" in advice.peers(found(rows))[0]
    assert advice.peers(found(rows[:3])) == []


def test_gpu_utilisation_against_the_checklist():
    def step(busy):
        row = {"name": "step", "value": 1800.0, "unit": "samples/s", "kind": "step"}
        return found([{**row, "utilization_pct": busy}], gpus=[gpu(0)])

    (idle,) = advice.utilisation(step(62.0))
    assert "busy 62%" in idle and "> 90%" in idle and "--profile" in idle
    assert "above the checklist" in advice.utilisation(step(97.0))[0]
    assert advice.utilisation(step(None)) == []  # a CPU run: no NVML reading, no line


def test_numa_nodes_links_ecc_and_persistence():
    gpus = [gpu(0, numa_node=0), gpu(1, numa_node=1, ecc_uncorrected=2, persistence=False)]
    gpus[1]["pcie"] = {"generation": 4, "width": 16, "max_generation": 5, "max_width": 16}
    f = found([copy(1, "host->device pinned", 20.0)], gpus=gpus, numa={0: [0, 1], 1: [2, 3]})
    numa = advice.numa(f)
    assert len(numa) == 2 and "GPU 1 sits on NUMA node 1" in numa[1] and "--membind=1" in numa[1]
    assert advice.numa(found([], gpus=gpus)) == []  # one node: nothing to bind
    link = advice.links(f)
    assert any("gen 4 x16 of gen 5 x16" in x for x in link)
    assert any("reach 20.0 GB/s, 32% of the link's nominal 63.0" in x for x in link)
    g = advice.gpus(f)
    assert any("2 uncorrected ECC errors" in x for x in g) and any("persistence" in x for x in g)


def test_doctor_runs_here_and_writes_its_findings(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "doctor",
                "--quick",
                "--recipe",
                str(RECIPES / "tiny_cpu.yaml"),
                "--data-path",
                str(RECIPES),
                "--out",
                "doc",
            ]
        )
        == 0
    )
    got = json.loads((tmp_path / "doc" / "doctor.json").read_text())
    rows = {r["name"]: r for r in got["measured"]["rows"]}
    assert rows["CPU memory copy"]["value"] > 0 and rows["loader alone"]["value"] > 0
    assert rows["training steps (loader + model)"]["value"] > 0
    if not got["facts"]["gpus"]:
        assert rows["host <-> device copies"]["value"] is None  # skipped, and says so
        assert any(line.startswith("no GPU") for line in got["advice"])
    assert any("the loader delivers" in line for line in got["advice"])
    out = capsys.readouterr().out
    assert "paratrain doctor" in out and "measurement" in out
    # the install checked first: sound here, so exit 0 and one line naming what was checked
    assert out.startswith("install: sound (torch ") and got["install"] == []


def test_doctor_bad_input_is_one_line(tmp_path, capsys):
    assert main(["doctor", "--recipe", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--recipe: no such file" in err
