"""Model parallelism for language models on CPU processes (gloo), each against one process:
tensor parallel (full training and LoRA, gradients clipped), FSDP x TP and HSDP on a 2 x 2
mesh, pipeline stages of decoder layers x data parallel (GPipe), the interleaved schedule (two
stages per rank) under FSDP, and a 2 x 2 checkpoint resumed on its own mesh and in one process.

A tiny random Llama on random tokens (every position trained, so a batch's mean loss does not
depend on how it is split), fp32, AdamW for 4 steps. Tolerances: AdamW divides by the root of
the second moment, so a rounding difference in a gradient near zero moves a weight by up to
about lr x 1e-3; 1e-4 absolute is what such runs reach (observed 2e-6 to 4e-5), and a wrong
reduction moves weights by lr = 1e-2 within a step, which the second check shows.
"""

import pytest
from conftest import TINY_LM, final_weights, max_abs_diff, read_result, run_cli, train

from paratrain.config import load_config

pytestmark = pytest.mark.dist

TOL = 1e-4
LM = [*TINY_LM, "train.max_steps=4", "train.lr=0.01"]


def sets(*settings):
    return [a for s in settings for a in ("--set", s)]


def run_parallel(tmp_path, name, nproc, *settings):
    out = tmp_path / name
    run_cli(["run", *sets(*LM, *settings), "--nproc", nproc, "--output-dir", out])
    return out


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process, in this one: full training with batch 8, LoRA with batch 4."""
    base = tmp_path_factory.mktemp("single")
    out = {}
    for name, extra in (
        ("full8", ["data.batch_size=8", "lora.enabled=false"]),
        ("lora4", ["data.batch_size=4"]),
    ):
        train(load_config(None, [*LM, *extra, f"output_dir={base / name}"]))
        out[name] = base / name
    return out


def close_to(run, reference, tol: float = TOL) -> float:
    diff = max_abs_diff(final_weights(run), final_weights(reference))
    assert diff < tol, diff
    a = read_result(run)["summary"]["train_loss"]
    b = read_result(reference)["summary"]["train_loss"]
    assert abs(a - b) < 1e-5 * abs(b), (a, b)
    return diff


def test_tensor_parallel_lora_equals_single(tmp_path, single):
    """LoRA's adapters beside a tensor-parallel base, under AdamW (whose steps move every
    trained weight by about lr, adapter A too once B is no longer zero); full training under
    tensor parallelism is the clipped-gradient test's and the 2 x 2 mesh's."""
    out = run_parallel(tmp_path, "tp", 2, "parallel.tp=2", "data.batch_size=4")
    close_to(out, single["lora4"])
    r = read_result(out)
    assert r["parallel"]["tp"] == 2 and r["strategy"] == "tp"
    assert r["summary"]["tokens_per_step"] == 4 * 32  # each tp rank's copy counted once


def test_fsdp_x_tp_2x2_equals_single_and_its_checkpoint_resumes_anywhere(tmp_path, single, capsys):
    """dp_shard=2 x tp=2 with batch 4 per data-parallel rank is one process with 8; its step-2
    checkpoint (sharded by both) resumes on the same mesh bit for bit, and in one process."""
    twod = ["strategy=fsdp", "parallel.tp=2", "data.batch_size=4", "lora.enabled=false"]
    out = run_parallel(tmp_path, "2d", 4, *twod, "checkpoint.every_steps=2", "checkpoint.keep=0")
    close_to(out, single["full8"])
    r = read_result(out)
    assert (
        r["parallel"]["label"] == "dp_shard=2 x tp=2" and r["parallel"]["data_parallel"] == "fsdp"
    )
    mid = out / "checkpoints" / "step_00000002"
    again = run_parallel(tmp_path, "again", 4, *twod, f"checkpoint.resume={mid}")
    assert read_result(again)["summary"]["steps_this_run"] == 2
    assert max_abs_diff(final_weights(again), final_weights(out)) == 0.0
    alone = tmp_path / "alone"
    capsys.readouterr()
    train(
        load_config(
            None,
            [*LM, "data.batch_size=8", "lora.enabled=false", f"checkpoint.resume={mid}"]
            + [f"output_dir={alone}"],
        )
    )
    said = capsys.readouterr().out
    assert "written by 4 processes (dp_shard=2 x tp=2), resharded to 1 rank" in said
    assert max_abs_diff(final_weights(alone), final_weights(out)) < TOL


def test_hsdp_2x2_equals_single(tmp_path, single):
    out = run_parallel(
        tmp_path,
        "hsdp",
        4,
        *("strategy=fsdp", "parallel.dp_replicate=2", "data.batch_size=2", "lora.enabled=false"),
    )
    close_to(out, single["full8"])
    assert read_result(out)["parallel"]["label"] == "dp_replicate=2 x dp_shard=2"


def test_pipeline_x_data_parallel_2x2_equals_single(tmp_path, single):
    """pp=2 x dp_replicate=2, GPipe: each stage replicated (FSDP2 on a mesh that shards over
    one rank: DDP's reducer takes one forward per backward, a schedule runs several). The
    pipeline of decoder layers alone (strategy=pipeline, 1F1B) is test_reshard.py's middle
    leg, against one process straight; the tiny CNN's stages alone are test_pipeline.py's."""
    out = run_parallel(
        tmp_path,
        "ppdp",
        4,
        *("parallel.pp=2", "parallel.dp_replicate=2", "pipeline.microbatches=2"),
        *("pipeline.schedule=gpipe", "data.batch_size=4", "lora.enabled=false"),
    )
    close_to(out, single["full8"])
    r = read_result(out)
    assert r["strategy"] == "ddp+pp" and r["parallel"]["pp"] == 2
    # each replica's tokens once: not once per stage
    assert r["summary"]["tokens_per_step"] == 2 * 4 * 32


def test_interleaved_pipeline_x_fsdp_2x2_equals_single(tmp_path):
    """pp=2 x dp_shard=2, interleaved 1F1B: 4 decoder layers in 4 stages, ranks of the pp axis
    holding two each (stages 0 and 2, 1 and 3), each stage sharded by FSDP2. SGD: no division
    by a gradient's own size, so the two runs agree to rounding (AdamW's noise on a near-zero
    gradient in 4 layers reaches 2e-4 for every pipeline schedule alike)."""
    deep = ["model.layers=4", "lora.enabled=false", "train.optimizer=sgd"]
    reference = tmp_path / "single"
    train(load_config(None, [*LM, *deep, "data.batch_size=4", f"output_dir={reference}"]))
    out = run_parallel(
        tmp_path,
        "interleaved",
        4,
        *deep,
        *("strategy=fsdp", "parallel.pp=2", "parallel.dp_shard=2", "data.batch_size=2"),
        *("pipeline.schedule=interleaved-1f1b", "pipeline.microbatches=2"),
    )
    assert max_abs_diff(final_weights(out), final_weights(reference)) < 1e-6
    a, b = (read_result(r)["summary"]["train_loss"] for r in (out, reference))
    assert abs(a - b) < 1e-5 * abs(b), (a, b)
    assert read_result(out)["parallel"]["label"] == "pp=2 x dp_shard=2"


@pytest.mark.parametrize(
    ("lora", "settings"),
    [
        (False, ["strategy=fsdp", "data.batch_size=2"]),
        (False, ["parallel.tp=2", "data.batch_size=4"]),
        (True, ["parallel.tp=2", "data.batch_size=4"]),
    ],
    ids=["fsdp", "tp", "tp-lora"],
)
def test_clipped_gradients_equal_single(tmp_path, lora, settings):
    """train.max_grad_norm over sharded gradients (FSDP's Shard(0), tensor parallel's mix of
    shards and replicas, and LoRA's plain adapters beside a sharded base) clips by the global
    norm: the same weights as one process. SGD, whose step moves with the gradient's size
    (AdamW's barely does), so the steps are small (q_proj's weights move ~3e-5 in 4 steps)
    and the runs are compared at 1e-6, as the interleaved pipeline's SGD runs are. The "tp" row
    is also this file's full training under tensor parallelism against one process."""
    clip = [f"lora.enabled={lora}", "train.optimizer=sgd", "train.lr=0.5"]
    base = tmp_path / "single"
    for name, extra in (("clipped", ["train.max_grad_norm=0.05"]), ("free", [])):
        train(
            load_config(
                None, [*LM, *clip, *extra, "data.batch_size=4", f"output_dir={base / name}"]
            )
        )
    out = run_parallel(tmp_path, "parallel", 2, *clip, "train.max_grad_norm=0.05", *settings)
    close_to(out, base / "clipped", tol=1e-6)
    if "parallel.tp=2" in settings:
        r = read_result(out)
        assert r["parallel"]["tp"] == 2 and r["strategy"] == "tp"
        assert r["summary"]["tokens_per_step"] == 4 * 32  # each tp rank's copy counted once
    # and the check can fail: unclipped, the same steps end elsewhere
    assert max_abs_diff(final_weights(base / "free"), final_weights(base / "clipped")) > 1e-3
