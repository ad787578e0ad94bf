"""The torchtitan peer (issue 34): paratrain's config in torchtitan's terms (its 0.2 command line
and its 0.3 Trainer.Config values, picked by the installed version), its log read back, and the
program skipped where torchtitan is not installed. The spec module's own test runs only where
torchtitan 0.2 is importable, the 0.3 config module's only where 0.3 is (it is not a
dependency); the full run is a GPU test (torchtitan trains on CUDA only)."""

import importlib.util
import json
import math
import sys

import pytest
import torch

from paratrain.bench.peers import torchtitan_args as tt
from paratrain.config import load_config, to_yaml

RECIPE = "recipes/llama3.2_1b_full_random.yaml"
HAS_TORCHTITAN = importlib.util.find_spec("torchtitan") is not None
TT_API = tt.api(tt.installed_version()) if HAS_TORCHTITAN else None


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
    cfg = load_config(RECIPE, ["train.compile=true", "train.fused_optimizer=true"])
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
        (["model.fp8=tensorwise", "model.fp8_lm_head=true"], "output layer in bf16"),
        (["model.fp8=delayed"], "scales float8 dynamically"),
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
def test_peer_is_skipped_without_torchtitan(tmp_path, monkeypatch, capsys):
    """The peer's main in this process (bench runs it as `python -m`, as the other peers whose
    entry points test_peers.py starts that way)."""
    from paratrain.bench.peers import torchtitan_ref

    cfg = tmp_path / "config.yaml"
    cfg.write_text(to_yaml(load_config(RECIPE, ["device=cpu"])))
    monkeypatch.setattr(sys, "argv", ["torchtitan_ref", str(cfg), str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        torchtitan_ref.main()
    assert stop.value.code == 3
    assert "skipped: torchtitan is not installed" in capsys.readouterr().err


@pytest.mark.skipif(TT_API != "v02", reason="torchtitan 0.2 is not installed")
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


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.2.2", "v02"),
        ("0.2.2+cu128", "v02"),
        ("0.1.0", "v02"),
        ("0.3.0", "v03"),
        ("0.3.1.dev20270101", "v03"),
        ("1.0.0", "v03"),
    ],
)
def test_the_installed_version_picks_the_interface(version, expected):
    assert tt.api(version) == expected


def test_an_unreadable_version_is_told_by_the_modules(monkeypatch, tmp_path):
    """A source checkout reports 0.0.0: 0.2's TrainSpec registry file (gone in 0.3) decides,
    found without importing torchtitan's package."""
    import types

    real = importlib.util.find_spec
    package = tmp_path / "torchtitan"
    (package / "protocols").mkdir(parents=True)

    def find(name, *args):
        if name == "torchtitan":
            return types.SimpleNamespace(submodule_search_locations=[str(package)])
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find)
    assert tt.api("0.0.0+unknown") == "v03" and tt.api(None) == "v03"
    (package / "protocols" / "train_spec.py").write_text("")
    assert tt.api("0.0.0+unknown") == "v02" and tt.api(None) == "v02"


def test_v03_command_names_the_config_function_and_v02_keeps_its_flags():
    cfg = load_config(RECIPE)
    assert tt.command_args(cfg, "/tmp/x", "0.3.0") == [
        "--module",
        "paratrain.bench.peers.torchtitan_v03",
        "--config",
        "paratrain_run",
        "--dump_folder=/tmp/x",
        "--debug.save_config_file=job_config.json",
    ]
    old = tt.command_args(cfg, "/tmp/x", "0.2.2")
    assert old == tt.command_args(cfg, "/tmp/x")  # 0.2's line by default, as before
    assert "--experimental.custom_import=paratrain.bench.peers.torchtitan_spec" in old


def test_v03_settings_follow_the_config():
    s = tt.settings_v03(load_config(RECIPE, ["train.compile=true", "train.fused_optimizer=true"]))
    assert s["shape"] == {
        "dim": 2048,
        "n_layers": 16,
        "n_heads": 32,
        "n_kv_heads": 8,
        "hidden_dim": 8192,
        "vocab_size": 128256,
        "norm_eps": 1e-6,
        "rope_theta": 500000.0,
        "rope_scaling": "none",  # paratrain's shapes have none; torchtitan's flavors scale
        "tie_embeddings": False,  # as the 0.2 peer
    }
    assert s["training"] == {
        "local_batch_size": 8,
        "seq_len": 2048,
        "steps": 30,
        "max_norm": math.inf,  # paratrain unclipped
        "dtype": "float32",
        "mixed_precision_param": "bfloat16",
    }
    assert s["optimizer"] == {
        "name": "AdamW",
        "lr": 0.0003,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "weight_decay": 0.0,
        "implementation": "fused",
    }
    assert s["lr_scheduler"] == {
        "warmup_steps": 0,
        "decay_ratio": 0.0,
        "decay_type": "linear",
        "min_lr_factor": 0.0,
    }
    assert s["compile"] is True and s["float8"] is None and s["activation_checkpoint"] is None
    assert s["log_freq"] == 10 and s["seed"] == load_config(RECIPE).seed
    other = tt.settings_v03(
        load_config(
            RECIPE,
            [
                "model.fp8=tensorwise",
                "train.max_grad_norm=1.0",
                "train.lr_schedule=cosine",
                "train.activation_checkpointing=true",
                "train.fused_optimizer=false",
                "train.compile=false",
                "precision=fp32",
            ],
        )
    )
    assert other["float8"] == {"recipe_name": "tensorwise", "filter_fqns": ["lm_head"]}
    assert other["training"]["max_norm"] == 1.0
    assert other["training"]["mixed_precision_param"] == "float32"
    assert other["lr_scheduler"]["decay_ratio"] is None
    assert other["lr_scheduler"]["decay_type"] == "cosine"
    assert other["activation_checkpoint"] == "full" and other["compile"] is False
    assert other["optimizer"]["implementation"] == "foreach"


def test_v03_needs_a_length_its_chunked_loss_divides_and_a_newer_torch():
    cfg = load_config(RECIPE, ["data.max_length=100"])
    assert "multiple of 8" in tt.unsupported_v03(cfg, "2.13.0+cu130")
    assert tt.unsupported(cfg, "0.2.2") is None and tt.unsupported(cfg) is None
    ok = load_config(RECIPE)
    assert tt.unsupported_v03(ok, "2.14.1") is None
    assert "needs torch 2.13 or later (this is 2.11.0+cu130)" in tt.unsupported_v03(
        ok, "2.11.0+cu130"
    )


def test_a_log_line_without_mfu_is_read():
    """torchtitan 0.3 prints no MFU under float8."""
    line = LOG.format(step=10, loss=9.0, tps=60_000).replace("53.54%", "N/A")
    (row,) = tt.read_log(line)
    assert row["step"] == 10 and row["tps"] == 60_000 and row["mfu_pct"] is None


@pytest.mark.skipif(TT_API != "v03", reason="torchtitan 0.3 is not installed")
@pytest.mark.parametrize("shape", ["tiny", "llama3.2-1b"])
def test_v03_config_builds_torchtitans_model_of_the_shape(shape, tmp_path, monkeypatch):
    """torchtitan 0.3's own Llama3Model from the config function's Trainer.Config, on the meta
    device: the transformers model's weights plus the untied output layer; its own parse of
    the command line keeps the values; the loader gives paratrain's rows with positions."""
    from paratrain.models.causal_lm.build import building, model_class, shape_config

    overrides = ["data.max_length=64", "train.max_steps=20", "train.warmup_steps=10"]
    cfg = load_config(None, [f"model.shape={shape}", *overrides, "device=cpu"])
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(cfg))
    monkeypatch.setenv("PARATRAIN_TT_CONFIG", str(path))
    monkeypatch.setenv("PARATRAIN_TT_OPTIONS", str(tmp_path / "options.json"))
    from paratrain.bench.peers.torchtitan_main import stand_in_for_hf_datasets

    stand_in_for_hf_datasets("v03")  # as the peer's entry point does where `datasets` is absent
    from torchtitan.config import ConfigManager

    config = ConfigManager().parse_args(tt.command_args(cfg, str(tmp_path), "0.3.0"))
    assert config.training.seq_len == 64 and not config.training.disable_cuda_graphs
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    with torch.device("meta"):
        model = model_config.build()
    hf_config = shape_config(shape)
    with building(torch.float32, "meta"):
        hf = model_class(hf_config)(hf_config)
    untied = hf_config.vocab_size * hf_config.hidden_size if hf_config.tie_word_embeddings else 0
    n = sum(p.numel() for p in model.parameters())
    assert n == sum(p.numel() for p in hf.parameters()) + untied
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    loader = config.dataloader.build(
        dp_world_size=2, dp_rank=1, tokenizer=tokenizer, seq_len=64, local_batch_size=4
    )
    inputs, labels = next(iter(loader))
    assert inputs["input"].shape == inputs["positions"].shape == labels.shape == (4, 64)
    torch.testing.assert_close(inputs["input"][:, 1:], labels[:, :-1])
    assert inputs["positions"][2].tolist() == list(range(64))
    options = json.loads((tmp_path / "options.json").read_text())
    assert options["cuda_graphs"] and options["attention"] == "FlexAttention"
