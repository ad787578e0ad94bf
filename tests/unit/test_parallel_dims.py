"""Degrees, shorthands and the one-line errors of model parallelism, in one process: nothing
here launches a worker."""

import pytest
from conftest import same_plan

from paratrain.cli import main
from paratrain.config import load_config, to_yaml
from paratrain.distributed.parallel_dims import ParallelConfig, ParallelDims, resolve_degrees
from paratrain.runplan import resolve
from paratrain.runplan.strategies import wrapper_for


def degrees(world, **kw):
    return resolve_degrees(ParallelConfig(**kw), world)


def test_degrees_fill_in_what_is_left_and_must_multiply_to_the_world():
    assert degrees(8, tp=2) == {"pp": 1, "dp_replicate": 4, "dp_shard": 1, "tp": 2}
    assert degrees(8, dp_shard=-1, tp=2) == {"pp": 1, "dp_replicate": 1, "dp_shard": 4, "tp": 2}
    assert degrees(8, dp_replicate=2, dp_shard=-1) == {
        "pp": 1,
        "dp_replicate": 2,
        "dp_shard": 4,
        "tp": 1,
    }
    assert degrees(4, pp=2, dp_shard=2, dp_replicate=1)["dp_shard"] == 2
    with pytest.raises(ValueError, match=r"parallel: the degrees \(tp=3\) multiply to 3, but"):
        degrees(4, dp_replicate=1, tp=3)
    with pytest.raises(ValueError, match="parallel.dp_replicate: the other degrees multiply to 3"):
        degrees(4, tp=3)
    with pytest.raises(ValueError, match="tp: only one degree can be -1"):
        ParallelConfig(dp_shard=-1, tp=-1)
    with pytest.raises(ValueError, match="pp: must be >= 1 or -1"):
        ParallelConfig(pp=0)


def test_dims_without_a_process_group_are_rank_zero():
    dims = ParallelDims(pp=1, dp_replicate=2, dp_shard=2, tp=2)
    assert dims.world_size == 8 and dims.dp_size == 4 and dims.dp_rank == 0
    assert dims.label() == "dp_replicate=2 x dp_shard=2 x tp=2"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], ("single", {}, "distributed")),
        (["launch.nproc=4"], ("ddp-ds", {"dp_replicate": 4}, "distributed")),
        (["launch.nproc=4", "data.sampler=full"], ("ddp-full", {"dp_replicate": 4}, "full")),
        (["strategy=ddp-rr"], ("ddp-rr", {"dp_replicate": 2}, "round-robin")),
        (["strategy=ddp-full"], ("ddp-full", {"dp_replicate": 2}, "full")),
        (["strategy=fsdp"], ("fsdp", {"dp_shard": 2}, "distributed")),
        (
            ["strategy=fsdp", "parallel.dp_replicate=2", "launch.nproc=4"],
            ("fsdp", {"dp_replicate": 2, "dp_shard": 2}, "distributed"),
        ),
        (["strategy=pipeline"], ("pipeline", {"pp": 2}, "distributed")),
        (
            ["data.source=synthetic-text", "model.init=random", "model.shape=tiny"]
            + ["parallel.tp=2", "launch.nproc=4"],
            ("auto", {"tp": 2, "dp_replicate": 2}, "distributed"),
        ),
    ],
)
def test_strategy_names_are_shorthands_for_degrees(overrides, expected):
    """On a CPU machine (2 processes unless launch.nproc says otherwise)."""
    strategy, degrees, sampler = expected
    plan = resolve(load_config(None, overrides))
    assert plan.strategy == strategy and plan.layout.sampler == sampler
    assert {k: v for k, v in plan.degrees.items() if v != 1} == degrees
    # config.yaml, as a run folder keeps it, resolves to the same plan
    again = resolve(load_config_from_yaml(to_yaml(plan.config)))
    assert same_plan(again) == same_plan(plan)


def load_config_from_yaml(text):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.yaml"
        path.write_text(text)
        return load_config(path)


def test_which_wrapper_the_data_parallel_axes_take():
    def dims(**kw):
        return {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1, **kw}

    assert wrapper_for("ddp-ds", dims(dp_replicate=2)) == "ddp"
    assert wrapper_for("ddp-ds", dims()) == "ddp"  # DDP on one rank, as before
    assert wrapper_for("fsdp", dims()) == "fsdp"
    assert wrapper_for("auto", dims(dp_replicate=2, dp_shard=2)) == "fsdp"  # HSDP
    assert wrapper_for("auto", dims(dp_replicate=2, tp=2)) == "fsdp"  # DTensors
    assert wrapper_for("auto", dims(dp_replicate=2, pp=2)) == "fsdp"
    assert wrapper_for("auto", dims(tp=2)) is None
    assert wrapper_for("single", dims()) is None


LM = [
    "--set",
    "data.source=synthetic-text",
    "--set",
    "model.init=random",
    "--set",
    "device=cpu",
]
BAD = [
    (
        ["--set", "model.shape=tiny", "--set", "parallel.tp=3", "--nproc", "2"],
        "parallel.dp_replicate: the other degrees",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "parallel.tp=2"]
        + ["--set", "parallel.dp_replicate=1", "--nproc", "4"],
        "parallel: the degrees (tp=2) multiply to 2, but the run has 4 processes",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "strategy=tp", "--nproc", "4"],
        "parallel.tp: 4 does not divide the model's num_key_value_heads (2)",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "strategy=pipeline", "--nproc", "4"],
        "parallel.pp: 4 pipeline stages but the model has only 2 decoder layers",
    ),
    (  # GPT-2's config answers Llama's names (n_head through its attribute_map)
        ["--set", "model.shape=tiny-gpt2", "--set", "strategy=tp", "--nproc", "8"],
        "parallel.tp: 8 does not divide the model's num_attention_heads (4)",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "strategy=pipeline", "--nproc", "1"],
        "launch.nproc: strategy pipeline needs at least 2 processes",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "strategy=ddp-ds", "--set", "parallel.tp=2"],
        "strategy: ddp-ds replicates whole models (DDP)",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "strategy=ddp-ds", "--set", "parallel.pp=2"],
        "strategy: ddp-ds replicates whole models (DDP), which holds no sharded",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "strategy=single", "--set", "parallel.tp=2"],
        "strategy: single runs in one process; the parallel.* degrees set (tp=2)",
    ),
    (
        [
            "--set",
            "model.shape=tiny",
            "--set",
            "parallel.tp=2",
            "--set",
            "model.loss_chunk_tokens=64",
        ],
        "model.loss_chunk_tokens: 64 is not built for tensor-parallel",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "parallel.pp=2", "--set", "data.packing=true"],
        "data.packing: packed rows need a block-diagonal mask",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "parallel.pp=2", "--set", "data.batch_size=3"],
        "pipeline.microbatches: data.batch_size 3 does not divide into 4",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "parallel.pp=2"]
        + ["--set", "model.attn_implementation=eager"],
        "model.attn_implementation: pipeline stages rely on causal attention without a mask",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "parallel.pp=2"]
        + ["--set", "pipeline.schedule=interleaved-1f1b"],
        "pipeline.stages_per_rank",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "model.layers=4", "--set", "parallel.pp=2"]
        + ["--set", "pipeline.schedule=interleaved-1f1b", "--set", "pipeline.microbatches=1"]
        + ["--set", "data.batch_size=2"],
        "pipeline.microbatches: the interleaved schedule takes a multiple of the 2",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "model.fp8=tensorwise"]
        + ["--set", "model.fp8_lm_head=true", "--set", "model.loss_chunk_tokens=64"],
        "model.fp8_lm_head: the chunked loss and Liger's fused loss multiply",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "strategy=fsdp", "--set", "model.fp8=delayed"],
        "model.fp8: delayed keeps an amax history in each whole layer",
    ),
    (
        ["--set", "model.shape=tiny", "--set", "strategy=ddp-rr", "--set", "data.sampler=full"],
        "data.sampler: strategy ddp-rr reads with the round-robin sampler, got full",
    ),
]


@pytest.mark.parametrize("args,message", BAD, ids=[b[1].split(":")[0] for b in BAD])
def test_bad_parallel_settings_are_one_line_exit_2_before_launch(args, message, capsys, tmp_path):
    code = main(["run", *LM, *args, "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("paratrain: error: "), err
    assert message in err, err
    assert not (tmp_path / "out").exists()  # nothing written, nothing launched


def test_tensor_parallelism_is_for_language_models(capsys):
    code = main(["run", "--set", "parallel.tp=2", "--nproc", "2", "--set", "device=cpu"])
    assert code == 2
    assert "parallel.tp: tensor parallelism splits language models' projections" in (
        capsys.readouterr().err
    )


def test_a_checkpoint_of_an_earlier_release_is_named(tmp_path):
    from paratrain.checkpoint import resolve_resume
    from paratrain.errors import UserError

    old = tmp_path / "step_00000010.pt"
    old.write_bytes(b"")
    with pytest.raises(UserError, match="single-file checkpoint of an earlier paratrain"):
        resolve_resume(str(old))


def test_resume_with_another_batch_counts_this_layouts_steps(tmp_path):
    """A checkpoint from batch 8 (32 steps an epoch) resumed with batch 16 (16 an epoch): the
    64 samples of epoch 1 already trained are 4 steps of the new layout, and the run ends after
    2 epochs of it (32 steps), not after the old count (64)."""
    from conftest import TINY_SETTINGS, read_result, train

    base = [*TINY_SETTINGS, "data.limit_samples=256", "train.epochs=2", "checkpoint.keep=0"]
    train(
        load_config(
            None,
            [*base, "data.batch_size=8", "checkpoint.every_steps=8"]
            + [f"output_dir={tmp_path / 'a'}"],
        )
    )
    mid = tmp_path / "a" / "checkpoints" / "step_00000040"
    train(
        load_config(
            None,
            [*base, "data.batch_size=16", f"checkpoint.resume={mid}"]
            + [f"output_dir={tmp_path / 'b'}"],
        )
    )
    s = read_result(tmp_path / "b")["summary"]
    assert s["optimizer_steps"] == 32 and s["steps_this_run"] == 12
