"""The report's arithmetic and layouts on hand-made rows."""

import dataclasses

import pytest

from paratrain.bench import arith
from paratrain.bench.render import to_csv, to_html, to_markdown
from paratrain.bench.report import build_report, group_rows, seed_tables
from paratrain.bench.store import Row, Store
from paratrain.config import load_config


def row(
    key,
    *,
    strategy="ddp-ds",
    nproc=1,
    thr=100.0,
    status="ok",
    precision="fp32",
    pin=True,
    repeat=0,
    label="paratrain",
    program="paratrain",
    acc=0.9,
    mem=2**30,
    redundant=False,
):
    cfg = load_config(
        None,
        [
            f"strategy={strategy}",
            f"launch.nproc={nproc}",
            f"precision={precision}",
            f"data.pin_memory={str(pin).lower()}",
        ],
    ).to_dict()
    params = {
        "strategy": strategy,
        "launch.nproc": nproc,
        "precision": precision,
        "data.pin_memory": pin,
    }
    ok = status == "ok"
    return Row(
        run_key=key,
        sweep="s",
        label=label,
        program=program,
        repeat=repeat,
        params=params,
        config=cfg,
        hardware={"gpu_name": "X", "gpu_count_visible": 2},
        git_commit="abc",
        started_at=key,
        finished_at=key,
        status=status,
        error=None if ok else "boom",
        unique_samples_per_s=thr if ok else None,
        step_time_s=0.1 if ok else None,
        val_accuracy=acc if ok else None,
        peak_memory_bytes=mem if ok else None,
        metrics={"measured_steps": 10} if ok else None,
        result={"redundant_data": redundant} if ok else None,
    )


def test_stat_median_and_range():
    s = arith.stat([3.0, 1.0, 2.0, None])
    assert (s.median, s.low, s.high, s.n) == (2.0, 1.0, 3.0, 3)
    assert s.fmt(1) == "2.0 [1.0-3.0]"
    assert arith.stat([None]) is None
    assert arith.stat([5.0]).fmt() == "5"


def test_speedup_and_efficiency():
    assert arith.speedup(380.0, 100.0) == pytest.approx(3.8)
    assert arith.efficiency(3.8, 4) == pytest.approx(0.95)
    assert arith.time_for(60_000, 600.0) == pytest.approx(100.0)


def test_repeats_group_into_median_with_failures_listed():
    rows = [
        row("a", thr=100),
        row("b", thr=120, repeat=1),
        row("c", thr=90, repeat=2),
        row("d", status="failed", repeat=3),
    ]
    (g,) = group_rows(rows)
    assert g.thr.median == 100 and (g.thr.low, g.thr.high) == (90, 120) and g.thr.n == 3
    assert len(g.failed) == 1 and "boom" in g.failed[0]


def test_dp_modes_table_speedup_efficiency_and_claims():
    rows = [
        row("1", nproc=1, thr=100),
        row("2", nproc=2, thr=196),
        row("3", strategy="ddp-full", nproc=1, thr=100),
        row("4", strategy="ddp-full", nproc=2, thr=101, redundant=True),
    ]
    tables, preamble = build_report({"s": ("dp_modes", {}, rows)})
    table = tables[0]
    ds = next(r for r in table.rows if r[0] == "ddp-ds")
    assert ds[1:5] == ["100", "196", "1.96x", "98%"]
    assert ds[5] == "600" and ds[6] == "306"  # 60,000 / 100 and / 196
    assert ds[-1] == "168%"  # the seed's 6.73x on 4 GPUs
    full = next(r for r in table.rows if r[0].startswith("ddp-full"))
    assert "redundant" in full[0] and full[3] == "1.01x"
    claims = " ".join(r[0] for r in tables[-1].rows)
    assert "1.96x on 2 processes (98% efficiency)" in claims and "contradicts" in claims
    assert "Hardware: 2x X" in " ".join(preamble)


def test_precision_table_relative_times():
    rows = [
        row("a", precision="fp32", nproc=2, thr=100),
        row("b", precision="fp16", nproc=2, thr=250),
        row("c", precision="fp64", nproc=2, thr=20, mem=3 * 2**30),
    ]
    tables, _ = build_report({"p": ("precision", {}, rows)})
    by = {r[0]: r for r in tables[0].rows}
    assert by["fp16"][3] == "0.40x" and by["fp64"][3] == "5.00x" and by["fp64"][5] == "3.0"
    assert by["fp64"][8] == "1.54x"  # the seed's 1937 / 1256
    assert by["fp64"][6] == "n/a"  # J/sample: no energy counter in these rows
    assert "919 s" in tables[-1].rows[0][0]


def test_pin_memory_table():
    rows = [row("a", pin=False, nproc=2, thr=100), row("b", pin=True, nproc=2, thr=110)]
    tables, _ = build_report({"m": ("pin_memory", {}, rows)})
    assert tables[0].rows[1][3] == "1.10x" and tables[0].rows[1][5] == "1.16x"


def test_variants_table_ratios_and_speed_of_light():
    rows = [
        row("p1", label="paratrain", nproc=1, thr=600),
        row("p2", label="paratrain", nproc=2, thr=1188),
        row("r1", label="plain", program="plain", nproc=1, thr=590),
        row("r2", label="plain", program="plain", nproc=2, thr=1120),
        row("s1", label="sol", program="sol", nproc=1, thr=1200),
    ]
    tables, _ = build_report({"v": ("variants", {"reference": "plain"}, rows)})
    p2 = next(r for r in tables[0].rows if r[0] == "paratrain" and r[2] == "2")
    assert p2[4] == "594" and p2[5] == "99.0%" and p2[6] == "1.06x" and p2[7] == "50%"


def test_speed_of_light_is_matched_by_precision():
    rows = [
        row("f", label="fastest fp16", nproc=1, thr=900, precision="fp16"),
        row("b", label="fastest bf16", nproc=1, thr=900, precision="bf16"),
        row("t", label="tf32", nproc=1, thr=500, precision="tf32"),
        row("s16", label="sol fp16", program="sol", nproc=1, thr=1000, precision="fp16"),
        row("s", label="sol bf16", program="sol", nproc=1, thr=1200, precision="bf16"),
    ]
    tables, _ = build_report({"v": ("variants", {}, rows)})
    light = {r[0]: r[7] for r in tables[0].rows}
    # fp16 against the fp16 ceiling, bf16 against bf16; no tf32 ceiling: the model's fastest.
    assert light["fastest fp16"] == "90%" and light["fastest bf16"] == "75%"
    assert light["tf32"] == "42%" and light["sol fp16"] == "100%"


def test_renderers(tmp_path):
    tables, preamble = build_report({"s": ("plain", {}, [row("a")])})
    assert "| configuration |" in to_markdown(tables, preamble)
    assert to_csv(tables).splitlines()[1].startswith("configuration")
    assert "<table>" in to_html(tables, preamble)


def test_store_round_trip_and_skip(tmp_path):
    store = Store(tmp_path / "r.db")
    store.put(row("k1"))
    store.put(row("k2", status="failed"))
    assert (
        store.status_of("k1") == "ok"
        and store.status_of("k2") == "failed"
        and store.status_of("x") is None
    )
    rows = store.rows()
    assert [r.run_key for r in rows] == ["k1", "k2"] and rows[0].config["strategy"] == "ddp-ds"
    store.export_csv(tmp_path / "r.csv")
    assert (tmp_path / "r.csv").read_text().count("\n") == 3


def test_seed_numbers_are_the_seeds():
    seed = seed_tables()
    assert seed["dp_modes"]["rows"]["ddp-ds"] == {"time_1": 6189, "time_n": 919, "speedup": 6.73}
    assert (
        seed["precision"]["rows"]["fp16"]["time"] == 919
        and seed["pin_memory"]["rows"]["true"]["time"] == 1165
    )
    assert seed["llm"]["rows"]["alpaca"] == {"it_1": 0.77, "it_n": 0.94}


def test_llm_table_tokens_scaling_and_seed_columns():
    def lm_row(key, label, nproc, tps, program="paratrain"):
        r = row(key, label=label, nproc=nproc, thr=tps / 2048, program=program)
        r.metrics = {
            "measured_steps": 10,
            "tokens_per_s": tps,
            "tokens_per_step": 4096.0 * nproc,
            "mfu": 0.4,
        }
        return r

    rows = [
        lm_row("a", "alpaca", 1, 10_000),
        lm_row("b", "alpaca", 2, 19_600),
        lm_row("c", "peft", 1, 8_000, "hf_lora"),
        lm_row("d", "peft", 2, 15_000, "hf_lora"),
    ]
    tables, _ = build_report({"l": ("llm", {"reference": "peft"}, rows)})
    a2 = next(r for r in tables[0].rows if r[0] == "alpaca" and r[1] == "2")
    assert a2[3:8] == ["8,192", "19,600", "9,800", "98.0%", "1.31x"]
    assert a2[8] == "40.0%" and a2[11] == "0.77 / 0.94" and a2[12] == "n/a"  # no telemetry
    assert a2[10] == "n/a"  # mJ/token: no energy counter
    # the title says which table: LoRA's (the seed's table 5.2) or full training's
    for r in rows:
        r.config["lora"]["enabled"] = False
    tables, _ = build_report({"l": ("llm", {"reference": "peft"}, rows)})
    assert tables[0].title.startswith("Language-model full training")
    rows[0].config["lora"]["enabled"] = True
    tables, _ = build_report({"l": ("llm", {"reference": "peft"}, rows)})
    assert tables[0].title.startswith("Language-model fine-tuning (seed table 5.2)")


def test_clock_column_is_the_slowest_gpu():
    r = row("a", nproc=2, label="x")
    r.metrics = {
        "measured_steps": 10,
        "gpu_telemetry": [{"sm_clock_mhz_mean": 1980.0}, {"sm_clock_mhz_mean": 1755.0}],
    }
    tables, _ = build_report({"v": ("variants", {}, [r])})
    assert tables[0].rows[0][-1] == "1,755" and any("SM MHz" in n for n in tables[0].notes)


def test_llm_plot_shows_tokens_per_gpu(tmp_path, monkeypatch):
    from paratrain.bench import plots

    r = row("a", label="alpaca", nproc=2, thr=5.0)
    r.metrics = {"measured_steps": 10, "tokens_per_s": 20_000.0}
    seen = {}
    real = plots.plt.subplots

    def spy(*args, **kwargs):
        fig, axes = real(*args, **kwargs)
        seen["axes"] = axes
        return fig, axes

    monkeypatch.setattr(plots.plt, "subplots", spy)
    (png,) = plots.plots_for("llm", "lora", group_rows([r]), tmp_path)
    bar = seen["axes"][0].patches[0]
    assert png.is_file() and bar.get_width() == 10_000.0  # tokens/s per GPU, not samples/s
    assert seen["axes"][0].get_xlabel() == "tokens/s per GPU"


def test_every_sweep_in_the_repo_loads():
    from conftest import RECIPES

    from paratrain.bench.sweep import load_sweep

    sweeps = sorted((RECIPES / "bench").glob("*.yaml"))
    assert len(sweeps) >= 6
    for path in sweeps:
        sweep = load_sweep(path)
        assert sweep.runs and len({r.key for r in sweep.runs}) == len(sweep.runs), path


def test_grid_and_set_from_the_command_line_reshape_a_sweep():
    from conftest import RECIPES

    from paratrain.bench.sweep import load_sweep, parse_axis
    from paratrain.errors import ConfigError

    base = load_sweep(RECIPES / "bench" / "speed.yaml")
    wide = load_sweep(
        RECIPES / "bench" / "speed.yaml",
        sets=["train.max_steps=7"],
        axes=["launch.nproc=1,2,4"],
    )
    nprocs = lambda s, label: sorted(r.params["launch.nproc"] for r in s.runs if r.label == label)  # noqa: E731
    assert nprocs(wide, "plain PyTorch (seed style)") == [1, 2, 4]
    assert nprocs(wide, "speed of light") == [1]  # a variant's own grid stays
    # an axis a variant's own grid does not name reaches it too
    workers = load_sweep(RECIPES / "bench" / "speed.yaml", axes=["data.num_workers=4,8"])
    for label in ("plain PyTorch (seed style)", "speed of light"):
        points = sorted(
            (r.params["launch.nproc"], r.config.data.num_workers)
            for r in workers.runs
            if r.label == label
        )
        want = [(1, 4), (1, 8)] + ([(2, 4), (2, 8)] if label.startswith("plain") else [])
        assert points == want, label
    assert all(r.config.train.max_steps == 7 for r in wide.runs)
    # the 1- and 2-GPU runs keep their keys only when nothing else changed
    same = load_sweep(RECIPES / "bench" / "speed.yaml", axes=["launch.nproc=1,2,4"])
    assert {r.key for r in base.runs} < {r.key for r in same.runs}
    assert parse_axis("precision=fp16, bf16") == ("precision", ["fp16", "bf16"])
    for bad in ("launch.nproc", "=1,2", "launch.nproc="):
        with pytest.raises(ConfigError, match="--grid"):
            parse_axis(bad)


def test_only_and_repeats_add_runs_beside_the_stored_ones():
    from conftest import RECIPES

    from paratrain.bench.sweep import load_sweep
    from paratrain.errors import ConfigError

    path = RECIPES / "bench" / "lora_speed.yaml"
    base = load_sweep(path)
    more = load_sweep(path, repeats=3, only=["fp8 TENSORWISE", "transformers"])
    assert {r.label for r in more.runs} == {
        "transformers + peft",
        "transformers + peft + Liger",
        "transformers + peft + Liger, compiled",
        "transformers + peft, compiled",
        "transformers + peft, compiled, largest batch (6)",
        "paratrain compile + chunked loss + fp8 tensorwise",
        "paratrain compiled, fp8 tensorwise",
        "paratrain compiled + fused AdamW, fp8 tensorwise",
        "paratrain compiled + fused AdamW + CUDA graphs, fp8 tensorwise",
        "paratrain compiled + fused AdamW, fp8 tensorwise + float8 lm_head",
    }
    # two variants on 1 and 2 GPUs, eight on 1 GPU only (their own grid), x 3 repeats
    assert len(more.runs) == (2 * 2 + 8) * 3
    # repeat 0 is the run already stored: a report then has three to take the median of
    assert {r.key for r in more.runs if r.repeat == 0} < {r.key for r in base.runs}
    # "=label" keeps the one row of that label, not the rows whose labels contain it
    exact = load_sweep(path, only=["=transformers + PEFT"])
    assert {r.label for r in exact.runs} == {"transformers + peft"}
    with pytest.raises(ConfigError, match="--only: no variant's label matches 'fsdq'"):
        load_sweep(path, only=["fsdq"])
    with pytest.raises(ConfigError, match="--repeats"):
        load_sweep(path, repeats=0)


def test_the_fastest_recipe_is_what_the_speed_sweep_measured():
    """recipes/mnist_sample_mobilenetv2_fastest.yaml is the speed sweep's "paratrain fastest"
    (the README quotes its numbers): same resolved config but for the sweep's short-run keys."""
    from conftest import RECIPES

    from paratrain.bench.sweep import load_sweep

    (run,) = [
        r
        for r in load_sweep(RECIPES / "bench" / "speed.yaml").runs
        if r.label == "paratrain fastest" and r.params["launch.nproc"] == 1
    ]
    measured = dataclasses.asdict(run.config)
    from paratrain.runplan import plan_of

    recipe = dataclasses.asdict(plan_of(RECIPES / "mnist_sample_mobilenetv2_fastest.yaml").config)
    # the sweep's short runs: 60 steps, no evaluation, no checkpoint, no progress bar
    short_run = {"train.max_steps", "train.warmup_steps", "train.eval", "checkpoint.at_end"}
    short_run.add("launch.nproc")  # the sweep's axis; --nproc on the command line
    short_run.add("launch.one_process")  # one rank (the sweep's nproc=1) runs in one process
    short_run.add("launch.cpu_threads")  # a sweep gives all its runs the same
    differ = [
        f"{section}.{key}"
        for section, values in measured.items()
        if isinstance(values, dict) and section != "log"
        for key in values
        if recipe[section][key] != values[key] and f"{section}.{key}" not in short_run
    ]
    assert differ == []


def test_a_speedup_above_the_ideal_or_a_wide_spread_is_marked_in_the_table():
    rows = [
        row("1", nproc=1, thr=91),
        row("2", nproc=2, thr=9995),  # issue 16's 110x on 2 CPU processes
        row("3", strategy="ddp-rr", nproc=1, thr=100, repeat=0),
        row("4", strategy="ddp-rr", nproc=1, thr=160, repeat=1),
        row("5", strategy="ddp-rr", nproc=2, thr=190),
    ]
    tables, _ = build_report({"s": ("dp_modes", {}, rows)})
    ds = next(r for r in tables[0].rows if r[0] == "ddp-ds")
    assert "above the ideal 2x: suspect" in ds[4], ds
    rr = next(r for r in tables[0].rows if r[0] == "ddp-rr")
    assert "repeats spread" in rr[4] and "above" not in rr[4], rr
    fine = build_report({"s": ("dp_modes", {}, [row("6", thr=100), row("7", nproc=2, thr=196)])})
    assert "⚠" not in " ".join(map(str, fine[0][0].rows))


def test_every_run_of_a_sweep_computes_with_the_same_threads(tmp_path):
    from conftest import RECIPES

    from paratrain.bench.sweep import load_sweep
    from paratrain.launch.torchrun import cores

    sweep = load_sweep(RECIPES / "bench" / "cpu_smoke.yaml")
    threads = {r.config.launch.cpu_threads for r in sweep.runs}
    assert threads == {max(1, cores() // 2)}  # its largest run has 2 processes
    again = load_sweep(RECIPES / "bench" / "cpu_smoke.yaml")
    assert [r.key for r in again.runs] == [r.key for r in sweep.runs]


def test_a_variant_may_have_a_time_limit_of_its_own(tmp_path):
    from conftest import RECIPES

    from paratrain.bench.sweep import load_sweep
    from paratrain.errors import ConfigError

    def sweep(timeout):
        path = tmp_path / "s.yaml"
        path.write_text(
            f"name: s\nrecipe: {RECIPES / 'tiny_cpu.yaml'}\nvariants:\n"
            f"  - {{label: quick, timeout_s: {timeout}}}\n  - {{label: other}}\ntimeout_s: 99\n"
        )
        return load_sweep(path)

    quick, other = sweep(5).runs
    assert (quick.timeout_s, other.timeout_s) == (5, None)  # None: the sweep's 99
    with pytest.raises(ConfigError, match=r"sweep.variants\[0\].timeout_s: must be a number > 0"):
        sweep("soon")


def test_a_failed_runs_cause_is_its_exception_not_torchruns_banner():
    from paratrain.bench.execute import cause_of
    from paratrain.bench.store import error_line

    # what a worker that ran out of memory leaves under torchrun: its traceback (its lines
    # prefixed with its rank), then the agent's own summary, which names no cause
    output = """step 1
[rank0]: Traceback (most recent call last):
[rank0]:   File "hf_lora.py", line 160, in main
[rank0]:     loss.backward()
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.83 GiB.
E1207 15:01:28 torch/distributed/elastic/multiprocessing/api.py failed (exitcode: 1)
Traceback (most recent call last):
  File "torchrun", line 8, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
paratrain.bench.peers.hf_lora FAILED
------------------------------------------------------------
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================"""
    assert cause_of(output).startswith("torch.OutOfMemoryError: CUDA out of memory")
    # exceptions without a message or an Error in their name; --tee's prefix; noise after
    for tail, cause in (
        ("AssertionError", "AssertionError"),
        ("triton.runtime.errors.OutOfResources: out of resource: shared memory", None),
    ):
        text = f"[default0]:Traceback (most recent call last):\n[default0]:  File x\n{tail}\n===="
        assert cause_of(text) == (cause or tail)
    shutdown = "Exception ignored in: <function X.__del__>\nTraceback (most recent call last):\n"
    assert cause_of(
        f"Traceback (most recent call last):\n  File y\nValueError: bad\n{shutdown}  File z\n"
        "AttributeError: 'NoneType'\n"
    ) == ("ValueError: bad")
    # no traceback: a tool's error line, not a metric named error; else the last line
    assert cause_of("x\nparatrain peer: error: torchtitan exited 1 (log: t.log)\n===") == (
        "paratrain peer: error: torchtitan exited 1 (log: t.log)"
    )
    assert cause_of("step 5 mean error: 0.3\nlast words\n=====\n") == "last words"
    # a stored error's headline is its first line: the cause, where execute_run put it
    assert error_line("exit 1: RuntimeError: boom\nmore") == "exit 1: RuntimeError: boom"
