"""The torchtitan peer (issue 34): paratrain's config in torchtitan's terms, its log read back,
and the program skipped where torchtitan is not installed. The spec module's own test runs only
where torchtitan is importable (it is not a dependency); the full run is a GPU test (torchtitan
trains on CUDA only)."""

import importlib.util
import subprocess
import sys

import pytest
import torch

from paratrain.bench.peers import torchtitan_args as tt
from paratrain.config import load_config, to_yaml

RECIPE = "recipes/llama3.2_1b_full_random.yaml"
HAS_TORCHTITAN = importlib.util.find_spec("torchtitan") is not None


def torchtitan_hidden(dim: int, mult: float, multiple: int) -> int:
    """torchtitan's FeedForward sizing (llama3/model/model.py), written out to check against."""
    hidden = int(mult * int(2 * 4 * dim / 3))
    return multiple * ((hidden + multiple - 1) // multiple)


@pytest.mark.parametrize(
    ("dim", "hidden"), [(2048, 8192), (4096, 14336), (64, 128), (3072, 8192), (768, 3072)]
)
def test_ffn_sizing_gives_the_shape_hidden_size(dim, hidden):
    mult, multiple = tt.ffn_sizing(dim, hidden)
    assert torchtitan_hidden(dim, mult, multiple) == hidden


def test_model_args_and_command_follow_the_config():
    cfg = load_config(RECIPE)
    args = tt.model_args(cfg)
    assert (args["dim"], args["n_layers"], args["n_heads"], args["n_kv_heads"]) == (2048, 16, 32, 8)
    assert args["vocab_size"] == 128256
    cmd = tt.command_args(cfg, "/tmp/x")
    assert "--training.max_norm=inf" in cmd  # paratrain unclipped: torchtitan clips nothing away
    assert "--compile.enable" in cmd and "--training.local_batch_size=8" in cmd
    assert "--lr_scheduler.decay_ratio=0.0" in cmd and "--activation_checkpoint.mode=none" in cmd
    assert not any("float8" in a for a in cmd)
    fp8 = load_config(RECIPE, ["model.fp8=tensorwise", "train.max_grad_norm=1.0"])
    cmd = tt.command_args(fp8, "/tmp/x")
    assert "--training.max_norm=1.0" in cmd
    assert "--quantize.linear.float8.recipe_name=tensorwise" in cmd
    assert "--metrics.log_freq=10" in cmd  # a window ends where paratrain's warm-up ends


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (["lora.enabled=true"], "trains every weight"),
        (["precision=fp16"], "precision fp16"),
        (["train.optimizer=sgd"], "AdamW"),
        (["train.max_steps=10"], "a multiple of train.warmup_steps"),
        (["train.max_steps=35"], "a multiple of train.warmup_steps"),
        (["model.shape=gpt2"], "builds Llama shapes"),
        (["model.kernels=liger"], "model.kernels"),
    ],
)
def test_what_the_peer_cannot_run_is_named(overrides, why):
    assert why in tt.unsupported(load_config(RECIPE, overrides))


LOG = (
    "[rank0]:[titan] 2026-12-03 07:40:01,123 - root - INFO - \x1b[31mstep:  {step}  "
    "\x1b[32mloss: {loss:8.5f}  \x1b[33mgrad_norm:  1.2345  \x1b[34mmemory: 61.20GiB(43.79%)  "
    "\x1b[35mtps: {tps:,}  \x1b[36mtflops: 529.45  \x1b[35mmfu: 53.54%\x1b[39m\n"
)


def test_log_lines_read_and_the_window_after_warm_up_measured():
    text = "".join(
        LOG.format(step=s, loss=loss, tps=tps)
        for s, loss, tps in (
            (1, 12.1, 1_000),
            (10, 9.0, 60_000),
            (20, 6.0, 64_000),
            (30, 5.6, 66_000),
        )
    )
    rows = tt.read_log("noise\n" + text + text)  # two ranks print the same lines
    assert [r["step"] for r in rows] == [1, 10, 20, 30] and rows[2]["loss"] == 6.0
    assert rows[0]["memory_gib"] == 61.2 and rows[0]["mfu_pct"] == 53.54
    w = tt.measured(rows, warmup=10, tokens_per_step=16384)
    # steps 11-30: two windows of 10 steps; tokens over their summed times (not a mean of rates)
    expected = 2 * 163840 / (163840 / 64_000 + 163840 / 66_000)
    assert w["measured_steps"] == 20 and w["tokens_per_s"] == pytest.approx(expected)
    with pytest.raises(ValueError, match="after step 30"):
        tt.measured(rows, warmup=30, tokens_per_step=16384)


@pytest.mark.skipif(HAS_TORCHTITAN, reason="torchtitan is installed here")
def test_peer_is_skipped_without_torchtitan(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(to_yaml(load_config(RECIPE, ["device=cpu"])))
    proc = subprocess.run(
        [sys.executable, "-m", "paratrain.bench.peers.torchtitan_ref", str(cfg), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 3 and "skipped: torchtitan is not installed" in proc.stderr


@pytest.mark.skipif(not HAS_TORCHTITAN, reason="torchtitan is not installed")
def test_spec_builds_torchtitans_model_of_the_shape_and_paratrains_rows(tmp_path, monkeypatch):
    """torchtitan's own Transformer built from the spec on the CPU: as many weights as the
    transformers model of the tiny shape, plus the untied output layer; rows of seq_len + 1."""
    from paratrain.models.causal_lm.build import model_class, shape_config

    cfg = load_config(None, ["model.shape=tiny", "data.max_length=32", "device=cpu"])
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(cfg))
    monkeypatch.setenv("PARATRAIN_TT_CONFIG", str(path))
    from paratrain.bench.peers.torchtitan_main import stand_in_for_hf_datasets

    stand_in_for_hf_datasets()  # as the peer's entry point does where `datasets` is absent
    spec_module = importlib.import_module("paratrain.bench.peers.torchtitan_spec")
    from torchtitan.protocols.train_spec import get_train_spec

    spec = get_train_spec(spec_module.NAME)
    model = spec.model_cls(spec.model_args["shape"])
    hf_config = shape_config("tiny")
    hf = model_class(hf_config)(hf_config)
    # torchtitan's output layer is its own weight; a tied shape lists it once in transformers
    untied = hf_config.vocab_size * hf_config.hidden_size if hf_config.tie_word_embeddings else 0
    n = sum(p.numel() for p in model.parameters())
    assert n == sum(p.numel() for p in hf.parameters()) + untied
    job = type("J", (), {"training": type("T", (), {"seq_len": 32, "local_batch_size": 4})})
    inputs, labels = next(iter(spec.build_dataloader_fn(2, 1, None, job)))
    assert inputs["input"].shape == labels.shape == (4, 32)
    torch.testing.assert_close(inputs["input"][:, 1:], labels[:, :-1])
