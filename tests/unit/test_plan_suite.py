"""The published suite `paratrain plan --validate published` checks the forecast against: what
each row carries, that it is priced through `plan --layout`'s own interface, and the errors as
bounds (docs/tune-plan.md has the table with every row's error and terms)."""

from __future__ import annotations

import json
import statistics

import pytest

from paratrain.cli import main
from paratrain.forecast.analytic import validate

# Kept out of the suite and of anything fitted (issue 61): the held-out set
HELD_OUT = ("asyncTP_llama3_h100_2025-06", "trainy-whitefiber", "trainy_whitefiber")


def test_every_source_says_where_it_is_from_and_what_ran():
    found = validate.run("published")
    for src in found["sources"]:
        for key in ("source", "url", "date", "system", "settings"):
            assert src[key].strip(), (src["source"], key)
        assert not any(h in src["url"] for h in HELD_OUT)
    s = found["summary"]
    assert s["rows"] >= 25 and s["sources"] >= 3 and len(s["gpu_kinds"]) >= 2, s


def test_a_row_priced_through_the_command_line_is_the_suites_number(capsys):
    """Each row names the `plan` flags that price it: where the row runs what the command has
    flags for, the command gives the suite's numbers."""
    found = validate.run("published")
    checked = 0
    for row, r in zip(validate.rows("published"), found["rows"], strict=True):
        t = row.training
        # what the command has no flag for: LoRA, fused AdamW, a bf16 all-gather under float8,
        # a source's own network
        if t.lora or t.fused_optimizer or t.fp8_all_gather is False or row.inter_gbps:
            continue
        assert main(["plan", *r["flags"].split(), "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert got["tps_per_gpu"] == pytest.approx(r["predicted_tps"]), r["row"]
        assert got["memory_gib"] == pytest.approx(r["predicted_gib"]), r["row"]
        checked += 1
    assert checked >= 20


def test_a_typo_in_a_suite_row_is_refused(tmp_path, monkeypatch):
    (tmp_path / "bad.toml").write_text(
        'source = "s"\nurl = "u"\ndate = "d"\nhardware = "h100-sxm"\nsystem = "x"\n'
        'settings = "y"\n[[row]]\ntable = "1"\nlabel = "r"\nshape = "llama3.1-8b"\ngpus = 8\n'
        "local_batch = 1\ntps = 1\ncompiled = true\n"
    )
    monkeypatch.setattr(validate, "SUITE", tmp_path)
    validate.source.cache_clear()
    try:
        with pytest.raises(Exception, match="unknown"):
            validate.source("bad")
    finally:
        validate.source.cache_clear()


# The errors as bounds, as they stand (docs/tune-plan.md): torchtitan's December 2024 tables
# and the lent rows within 16% each (the worst, +15.7%, a 128-GPU row), median within 10%;
# memory within 20% on every row that publishes it but the 405B 1F1B row (a documented miss,
# -22.5%); the published suite's median within 10% (9.8%; issue 61 asks 8%: not met).
def test_validation_errors_bounded():
    rows = validate.run("torchtitan-h100")["rows"]
    for r in rows:
        assert abs(r["tps_error"]) <= 0.16, r["row"]
    assert statistics.median(abs(r["tps_error"]) for r in rows) <= 0.10
    every = validate.run("published")
    for r in every["rows"]:
        if r["memory_error"] is not None and not r["memory_miss"]:
            assert abs(r["memory_error"]) <= 0.20, r["row"]
    assert every["summary"]["median_tps_error"] <= 0.10
    # the shape of the tables: float8 faster than bf16, compile than eager, async TP than TP,
    # interleaved than 1F1B. 128 GPUs against 8: torchtitan measured 2.7% slower; the model
    # hides nearly all of FSDP's collectives at both and gives 128 the smaller optimizer
    # shard, so it says 1% faster (what makes 128 slower is in no term): within 3% either way
    tps = {(r["table"], r["row"]): r["predicted_tps"] for r in rows}
    assert tps["1", "FSDP + compile + float8"] > tps["1", "FSDP + compile"] > tps["1", "FSDP"]
    assert tps["3", "FSDP"] / tps["1", "FSDP"] == pytest.approx(1, abs=0.03)
    assert tps["4", "FSDP 32 x async TP 8"] > tps["4", "FSDP 32 x TP 8"]
    five = [r["predicted_tps"] for r in rows if r["table"] == "5"]
    assert five[1] / five[0] == pytest.approx(128 / 100, rel=0.05)


def test_the_flags_name_the_profile_a_row_was_priced_on():
    found = validate.run("torchtitan-h100", "h100-sxm")
    assert all(r["flags"].startswith("--hardware h100-sxm ") for r in found["rows"])
    out = validate.table(validate.run("torchtitan-h100"), terms=True)
    assert "`--hardware h100-hbm2e-500w --shape llama3.1-8b --gpus 8 --layout fsdp" in out


def test_the_suite_as_json(capsys):
    assert main(["plan", "--validate", "published", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["summary"]["rows"] == len(found["rows"]) >= 25
    first = found["rows"][0]
    assert {"flags", "terms", "tps", "predicted_tps", "tps_error", "source"} <= set(first)
