"""Seed 001 §6's "model parallel GPT" on CPU processes (gloo): GPT-2 (transformers'
GPT2LMHeadModel: Conv1D projections, q/k/v fused in c_attn, lm_head tied to wte) under tensor
parallelism (full; LoRA with a vocabulary that does not split evenly; both sequence parallel)
and pipeline stages, each against one process. A tensor-parallel checkpoint
resumes in one process; one process's checkpoint resumes as a pipeline, whose last stage holds
the tied lm_head copy that a single process saves under wte's name.

tiny-gpt2 on random tokens, fp32, AdamW, 4 steps at lr 0.01; TOL as test_model_parallel.py's
(AdamW's rounding noise on near-zero gradients; a wrong split moves weights by about lr).
"""

import pytest
from conftest import final_weights, max_abs_diff, read_result, run_cli, sets, train

from paratrain.config import load_config

pytestmark = pytest.mark.dist

TOL = 1e-4
GPT2 = [
    "data.source=synthetic-text",
    "model.init=random",
    "model.shape=tiny-gpt2",
    "device=cpu",
    "data.num_workers=0",
    "data.max_length=32",
    "data.batch_size=4",
    "train.warmup_steps=1",
    "train.max_steps=4",
    "train.lr=0.01",
    "log.progress=false",
]
FULL = [*GPT2, "lora.enabled=false"]


def one_process(out, *settings):
    train(load_config(None, [*settings, f"output_dir={out}"]))
    return out


def parallel(out, *settings):
    run_cli(["run", *sets(*settings), "--nproc", 2, "--output-dir", out])
    return out


def same_run(run, reference, tol=TOL):
    assert max_abs_diff(final_weights(run), final_weights(reference)) < tol
    a = read_result(run)["summary"]["train_loss"]
    b = read_result(reference)["summary"]["train_loss"]
    assert abs(a - b) < 1e-5 * abs(b), (a, b)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    base = tmp_path_factory.mktemp("single")
    full = one_process(base / "full", *FULL, "checkpoint.every_steps=2", "checkpoint.keep=0")
    return {"full": full}


def test_gpt2_tensor_parallel_equals_single_and_resumes_in_one_process(tmp_path, single):
    """tp=2 with sequence parallelism: c_attn's contiguous column shards, gathered and cut to
    each rank's heads, train as one process does; its step-2 checkpoint (Conv1D weights split
    by columns and rows) finishes the run in one process."""
    tp = parallel(tmp_path / "tp", *FULL, "parallel.tp=2", "checkpoint.every_steps=2")
    same_run(tp, single["full"])
    r = read_result(tp)
    assert r["parallel"]["tp"] == 2 and r["summary"]["tokens_per_step"] == 4 * 32
    # and the tolerance can tell: two steps move the weights far more than TOL
    mid = sorted((single["full"] / "checkpoints").iterdir())[0]
    from conftest import read_ckpt

    moved = max_abs_diff(read_ckpt(mid)["model"], final_weights(single["full"]))
    assert moved > 100 * TOL, moved
    alone = one_process(
        tmp_path / "alone",
        *FULL,
        f"checkpoint.resume={tp / 'checkpoints' / 'step_00000002'}",
    )
    assert max_abs_diff(final_weights(alone), final_weights(single["full"])) < TOL


def test_gpt2_tensor_parallel_lora_with_an_uneven_vocabulary_equals_single(tmp_path):
    """Adapters on c_attn (lora_B split like its columns, before the q/k/v gather) and on
    attn.c_proj (lora_A split by rows, reduced to whole activations for lora_B), sequence
    parallel; and a vocabulary that splits over no tp (GPT-2's 50,257 rows): 321 rows (the byte
    tokenizer's 259 inside) from a config folder. SGD: no division by a gradient's own size, so
    the two runs agree to rounding."""
    from transformers import GPT2Config

    from paratrain.data.text.tokenizer import byte_tokenizer
    from paratrain.models.causal_lm.build import shape_of

    folder = tmp_path / "gpt2-321"
    fields = {k: v for k, v in shape_of("tiny-gpt2").items() if k != "model_type"}
    GPT2Config(**{**fields, "vocab_size": 321}).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    odd = [*(s for s in GPT2 if not s.startswith("model.shape")), f"model.path={folder}"]
    odd.append("train.optimizer=sgd")
    reference = one_process(tmp_path / "single", *odd)
    tp = parallel(tmp_path / "tp", *odd, "parallel.tp=2")
    same_run(tp, reference, tol=1e-6)
    adapters = [k for k in final_weights(tp) if "lora_" in k]  # what a LoRA checkpoint holds
    assert len(adapters) == 2 * 2 * 2, adapters  # A and B on c_attn and c_proj, in 2 layers


def test_gpt2_pipeline_continues_a_single_process_run(tmp_path, single):
    """pp=2 from the one-process step-2 checkpoint: the first stage holds wte and wpe, the
    last ln_f and the tied lm_head, whose optimizer state the checkpoint keeps under wte's name.
    The two copies' gradients are summed each step, so both stay the one process's weight."""
    mid = single["full"] / "checkpoints" / "step_00000002"
    pp = parallel(
        tmp_path / "pp",
        *FULL,
        "parallel.pp=2",
        "pipeline.microbatches=2",
        f"checkpoint.resume={mid}",
    )
    weights = final_weights(pp)
    assert max_abs_diff(weights, final_weights(single["full"])) < TOL
    assert (weights["lm_head.weight"] - weights["transformer.wte.weight"]).abs().max() < TOL
    r = read_result(pp)
    assert r["parallel"]["pp"] == 2 and r["summary"]["steps_this_run"] == 2
