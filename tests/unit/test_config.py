import dataclasses

import pytest

from paratrain.cli import main
from paratrain.config import RunConfig, describe_keys, load_config, to_yaml
from paratrain.errors import ConfigError


def test_defaults_and_overrides_are_typed(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("strategy: ddp-rr\ndata:\n  batch_size: 32\n")
    cfg = load_config(
        recipe,
        [
            "precision=fp16",
            "data.pin_memory=false",
            "train.lr=1e-3",
            "train.max_steps=7",
            "scaler.init_scale=1024",
            "checkpoint.dir=null",
            "data.image_size=500",
        ],
    )
    assert cfg.name == "r" and cfg.strategy == "ddp-rr" and cfg.data.batch_size == 32
    assert cfg.precision == "fp16" and cfg.data.pin_memory is False
    assert cfg.train.lr == pytest.approx(1e-3) and isinstance(cfg.train.lr, float)
    assert cfg.train.max_steps == 7 and cfg.scaler.init_scale == 1024.0
    assert cfg.checkpoint.dir is None and cfg.data.image_size == 500


def test_yaml_round_trip(tmp_path):
    cfg = load_config(None, ["strategy=ddp-ds", "data.batch_size=8", "precision=bf16"])
    path = tmp_path / "c.yaml"
    path.write_text(to_yaml(cfg))
    assert load_config(path) == cfg


def test_compile_options_are_dotted_inductor_settings_on_top_of_the_mode(tmp_path):
    cfg = load_config(
        None,
        [
            "train.compile_mode=max-autotune-no-cudagraphs",
            "train.compile_options.coordinate_descent_tuning=false",
            "train.compile_options.triton.cudagraphs=true",
        ],
    )
    options = {"coordinate_descent_tuning": False, "triton.cudagraphs": True}
    assert cfg.train.compile_options == options
    # torch.compile takes a mode or options: the mode's own settings, the user's over them
    assert cfg.train.compile_kwargs() == {"options": {"max_autotune": True, **options}}
    assert load_config(None).train.compile_kwargs() == {"mode": "default"}
    # a unit re-run inside backward (the chunked loss) never gets CUDA graphs
    graphs = load_config(None, ["train.compile_mode=reduce-overhead"]).train
    assert graphs.compile_kwargs() == {"mode": "reduce-overhead"}
    assert graphs.compile_kwargs(cuda_graphs=False) == {"options": {"triton.cudagraphs": False}}
    assert cfg.train.compile_kwargs(cuda_graphs=False)["options"]["triton.cudagraphs"] is False
    path = tmp_path / "c.yaml"
    path.write_text(to_yaml(cfg))
    assert load_config(path) == cfg


def test_every_key_has_a_docstring():
    rows = describe_keys()
    assert len(rows) > 40
    missing = [key for key, _, doc in rows if not doc]
    assert not missing, f"fields without a docstring: {missing}"


def test_seed_scaler_defaults():
    s = RunConfig().scaler
    assert (s.init_scale, s.growth_factor, s.growth_interval) == (65536.0, 2.0, 2000)


BAD = [
    (
        ["--set", "strategy=ddp"],
        "strategy: got 'ddp'; accepted: single, dp, ddp-full, ddp-rr, ddp-ds",
    ),
    (["--set", "precision=fp8"], "precision: got 'fp8'"),
    (["--set", "data.pin_memory=maybe"], "data.pin_memory: expected true or false, got 'maybe'"),
    (["--set", "data.batch_size=0"], "data.batch_size: must be >= 1, got 0"),
    (["--set", "data.batch_size=big"], "data.batch_size: expected an integer, got 'big'"),
    (["--set", "data.bogus=1"], "data.bogus: unknown key"),
    (["--set", "nonsense=1"], "nonsense: unknown key"),
    (["--set", "train.lr=-1"], "train.lr: must be > 0"),
    (["--set", "train.gc_every_steps=-1"], "train.gc_every_steps: must be >= 0"),
    (
        ["--set", "strategy=fsdp", "--set", "ddp.gradient_compression=bf16"],
        "ddp.gradient_compression: compresses DDP's all-reduce; strategy fsdp has none",
    ),
    (["--set", "ddp.powersgd_start_step=1"], "ddp.powersgd_start_step: must be >= 2"),
    (
        ["--set", "strategy=fsdp", "--set", "sync.mode=local_sgd"],
        "sync.mode: local_sgd changes how DDP's replicas agree; strategy fsdp has none",
    ),
    (
        ["--set", "strategy=ddp-full", "--set", "sync.mode=diloco"],
        "sync.mode: diloco changes how DDP's replicas agree; strategy ddp-full",
    ),
    (
        ["--set", "strategy=ddp-ds", "--set", "sync.mode=stale", "--set", "precision=fp16"],
        "sync.mode: stale keeps gradients off DDP's all-reduce",
    ),
    (
        ["--set", "strategy=ddp-ds", "--set", "sync.mode=local_sgd", "--set", "precision=fp16"],
        "sync.mode: local_sgd keeps gradients off DDP's all-reduce",
    ),
    (
        [
            *("--set", "strategy=ddp-ds", "--set", "sync.mode=stale"),
            *("--set", "ddp.gradient_compression=int8"),
        ],
        "sync.mode: stale runs its own fp32 all-reduce",
    ),
    (["--set", "sync.every_steps=0"], "sync.every_steps: must be >= 1"),
    (
        [
            *("--set", "strategy=ddp-ds", "--set", "sync.simulated_gbps=1"),
            *("--set", "ddp.gradient_compression=powersgd"),
        ],
        "sync.simulated_gbps: PowerSGD's bytes are not counted",
    ),
    (
        ["--set", "strategy=ddp-ds", "--set", "parallel.cpu_offload=true"],
        "parallel.cpu_offload: moves FSDP's shards to host memory; strategy ddp-ds has none",
    ),
    (["--set", "data.num_workers=-2"], "data.num_workers: must be >= 0"),
    (["--set", "scaler.backoff_factor=2"], "scaler.backoff_factor: must be in (0, 1)"),
    (
        ["--set", "strategy=single", "--nproc", "2"],
        "launch.nproc: strategy single runs in one process",
    ),
    (["--set", "data.source=mnist"], "data.path: source mnist reads files"),
    (["--set", "model.name=no such model"], "model.name: got 'no such model'"),
    (
        ["--set", "precision=tf32", "--set", "device=cpu"],
        "precision: tf32 is a CUDA tensor-core mode",
    ),
    # device=auto: the config loads (a GPU sweep on a laptop); this machine has no GPU to run it
    (
        ["--set", "precision=tf32"],
        "precision: tf32 is a CUDA tensor-core mode and no GPU is in use",
    ),
    (
        ["--set", "data.prefetch_factor=2", "--set", "data.num_workers=0"],
        "data.prefetch_factor: needs num_workers > 0",
    ),
    (["--set", "launch.nnodes=2"], "launch.rdzv_endpoint: a multi-node run needs host:port"),
    (["--set", "strategy.x=1"], "strategy: got {'x': 1}; accepted"),
    (["--set", "strategy=dp", "--set", "strategy.x=1"], "strategy: is a value, not a group"),
    (["--set", "noequals"], "--set: expected key=value"),
    (["--set", "data.image_size=3"], "data.image_size: must be in [8, 4096]"),
    (["--set", "train.grad_accum_steps=0"], "train.grad_accum_steps: must be >= 1"),
    (["--set", "data.source=alpacca"], "data.source: got 'alpacca'; accepted:"),
    (["--set", "data.source=alpaca"], "data.path: source alpaca reads files"),
    (
        ["--set", "data.source=synthetic-text"],
        "model.path: a text data set fine-tunes a language model",
    ),
    (["--set", "model.init=random"], "model.shape: init=random needs a shape"),
    (["--set", "lora.r=0"], "lora.r: must be >= 1"),
    (
        ["--set", "train.compile_options.coordinate_decent_tuning=true"],
        "train.compile_options: 'coordinate_decent_tuning' is not a torch._inductor.config",
    ),
    (
        ["--set", "train.compile_options.triton.cudagraphs=yes please"],
        "train.compile_options: triton.cudagraphs takes true or false",
    ),
    (["--set", "ddp.bucket_cap_mb=0"], "ddp.bucket_cap_mb: must be > 0"),
    (
        ["--set", "strategy=pipeline", "--set", "train.compile=true"],
        "train.compile: not with strategy=pipeline yet",
    ),
    (
        ["--set", "strategy=pipeline", "--set", "precision=fp16"],
        "precision: fp16's loss scaling is not wired through pipeline stages",
    ),
    (
        ["--set", "strategy=pipeline", "--set", "train.grad_accum_steps=2"],
        "train.grad_accum_steps: a pipeline accumulates over its micro-batches already",
    ),
    (
        ["--set", "strategy=pipeline", "--set", "data.batch_size=30"],
        "pipeline.microbatches: data.batch_size 30 does not divide into 4",
    ),
    (["--set", "pipeline.microbatches=0"], "pipeline.microbatches: must be >= 1"),
    (
        ["--set", "pipeline.boundaries=[5, 3]"],
        "pipeline.boundaries: must be increasing block indices >= 1, got [5, 3]",
    ),
    (["--set", "pipeline.schedule=zb"], "pipeline.schedule: got 'zb'; accepted: gpipe, 1f1b"),
    (["--set", "train.compile_options=7"], "train.compile_options: expected a group of settings"),
    (
        ["--set", "model.depthwise_conv=shift-add"],
        "model.depthwise_conv: shift-add is written for torch.compile",
    ),
    (
        ["--set", "strategy=fsdp", "--set", "lora.save_merged=true"],
        "lora.save_merged: merging needs whole weights",
    ),
]


@pytest.mark.parametrize("args,message", BAD, ids=[b[1].split(":")[0] for b in BAD])
def test_bad_config_is_one_line_exit_2(args, message, capsys, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("precious")
    code = main(["run", *args, "--output-dir", str(out_dir)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("paratrain: error: "), err
    assert message in err
    assert sorted(p.name for p in out_dir.iterdir()) == ["keep.txt"]  # nothing written


@pytest.mark.parametrize(
    "content,message",
    [
        ("strategy: [unclosed", "is not valid YAML"),
        ("- a\n- b\n", "must hold a mapping of keys"),
        ("data: 5\n", "data: expected a group of keys"),
    ],
)
def test_bad_recipe_file(tmp_path, capsys, content, message):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(content)
    assert main(["run", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_missing_recipe(capsys):
    assert main(["run", "/nonexistent/recipe.yaml"]) == 2
    assert "recipe: file not found" in capsys.readouterr().err


def test_print_config_shows_resolved_values(capsys):
    assert main(["run", "--set", "strategy=ddp-ds", "--nproc", "4", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "strategy: ddp-ds" in out and "nproc: 4" in out


def test_recipes_in_repo_all_load():
    from conftest import RECIPES

    recipes = sorted(RECIPES.glob("*.yaml")) + sorted((RECIPES / "cases").glob("*.yaml"))
    assert len(recipes) > 15
    for recipe in recipes:
        cfg = load_config(recipe)
        assert dataclasses.is_dataclass(cfg)


def test_config_error_is_value_error():
    with pytest.raises(ConfigError):
        load_config(None, ["data.shuffle=2"])


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("train.lerning_rate", "did you mean train.lr? (learning_rate elsewhere)"),
        ("train.learning_rate", "did you mean train.lr?"),
        ("train.num_epochs", "did you mean train.epochs?"),
        ("train.batch_size", "did you mean data.batch_size?"),
        ("data.epochs", "did you mean train.epochs?"),
        ("train.gradient_accumulation_steps", "did you mean train.grad_accum_steps?"),
        ("train.bf16", "did you mean precision (precision=bf16)?"),
        ("train.lrr", "did you mean lr?"),
    ],
)
def test_a_misspelt_key_or_another_tools_name_points_to_paratrains_key(key, says):
    """issue 50: the nearest key, another group's key of that name, or paratrain's key for what
    other tools call it (HF Trainer's learning_rate, Lightning's max_epochs)."""
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}=1"])
    assert says in str(e.value) and "accepted keys" in str(e.value)
