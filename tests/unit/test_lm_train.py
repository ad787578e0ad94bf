"""LoRA fine-tuning of a tiny random Llama in one process."""

import copy
import dataclasses
import math

import pytest
import torch
from conftest import adapter_logits, last_checkpoint, lm_settings, read_ckpt, train, write_alpaca

import paratrain.tasks.causal_lm as lm_task
from paratrain.config import load_config


def capture_workload(monkeypatch) -> dict:
    """Wrap the causal_lm task's build: the dict gets the workload, its model and the weights before training."""
    seen = {}
    build = lm_task.build

    def spy(*args, **kwargs):
        work = build(*args, **kwargs)
        seen["work"], seen["model"] = work, work.model
        seen["before"] = {n: p.detach().clone() for n, p in work.model.named_parameters()}
        return work

    monkeypatch.setattr(lm_task, "TASK", dataclasses.replace(lm_task.TASK, build=spy))
    return seen


def test_lora_trains_only_adapters_and_loss_falls(tmp_path, monkeypatch):
    seen = capture_workload(monkeypatch)
    data = write_alpaca(tmp_path / "alpaca.json")
    cfg = load_config(
        None, lm_settings(data) + ["train.epochs=5", f"output_dir={tmp_path / 'run'}"]
    )
    result = train(cfg)

    losses = [e["train_loss"] for e in result["epochs"]]
    assert losses[-1] < losses[0] - 0.05, losses
    after = dict(seen["model"].named_parameters())
    changed = {n for n, before in seen["before"].items() if not torch.equal(before, after[n])}
    assert changed and all("lora_" in n for n in changed)  # only adapters moved
    assert {n for n in after if "lora_B" in n} <= changed  # ... and all of B (A may stay close)
    s = result["summary"]
    assert (
        s["tokens_per_s"] > 0
        and s["tokens_per_step"] > 0
        and s["val_loss"] > 0
        and s["mfu"] is None
        and s["gpu_telemetry"] is None
    )
    assert result["workload"]["random_init"] and result["workload"]["trainable_parameters"] < 20_000


def test_adapter_reloads_with_peft_and_gives_the_same_logits(tmp_path):
    data = write_alpaca(tmp_path / "alpaca.json")
    run = tmp_path / "run"
    train(load_config(None, lm_settings(data) + ["train.max_steps=10", f"output_dir={run}"]))
    loaded, from_ckpt, plain = adapter_logits(run)
    torch.testing.assert_close(loaded, from_ckpt)
    assert (loaded - plain).abs().max() > 1e-4  # the adapter does something
    assert (run / "adapter" / "adapter_config.json").is_file() and (
        run / "adapter" / "tokenizer.json"
    ).is_file()
    ckpt = read_ckpt(last_checkpoint(run))
    assert ckpt["model"] and all("lora_" in k for k in ckpt["model"])  # frozen base not rewritten


def test_gradient_checkpointing_and_packing_run(tmp_path):
    data = write_alpaca(tmp_path / "alpaca.json")
    cfg = load_config(
        None,
        lm_settings(data)
        + [
            "train.max_steps=4",
            "train.activation_checkpointing=true",
            "data.packing=true",
            "data.max_length=512",
            "data.batch_size=2",
            f"output_dir={tmp_path / 'run'}",
        ],
    )
    s = train(cfg)["summary"]
    # packed rows are nearly full, and every step trained (no row without a trained token)
    assert s["optimizer_steps"] == 4 and s["tokens_per_step"] > 600 and s["skipped_steps"] == []
    assert math.isfinite(s["train_loss"])


def test_synthetic_text_needs_no_data(tmp_path):
    cfg = load_config(
        None,
        [
            "data.source=synthetic-text",
            "model.init=random",
            "model.shape=tiny",
            "device=cpu",
            "data.num_workers=0",
            "data.batch_size=2",
            "data.max_length=64",
            "train.max_steps=3",
            "log.progress=false",
            f"output_dir={tmp_path / 'run'}",
            "train.warmup_steps=1",
        ],
    )
    result = train(cfg)
    assert not result["data_real"] and result["summary"]["tokens_per_step"] == 2 * 64


def test_fine_tune_from_a_checkpoint_directory(tmp_path):
    """model.path: a saved Hugging Face checkpoint with its tokenizer, loaded the real way."""
    from paratrain.data.text.tokenizer import byte_tokenizer
    from paratrain.models.causal_lm.build import build_causal_lm

    ckpt = tmp_path / "hf"
    build_causal_lm(None, "random", "tiny", "sdpa", torch.float32).save_pretrained(ckpt)
    byte_tokenizer().save_pretrained(ckpt)
    data = write_alpaca(tmp_path / "alpaca.json")
    settings = [s for s in lm_settings(data) if not s.startswith("model.")]
    result = train(
        load_config(
            None,
            settings
            + [f"model.path={ckpt}", "train.max_steps=3", f"output_dir={tmp_path / 'run'}"],
        )
    )
    assert not result["workload"]["random_init"] and result["summary"]["optimizer_steps"] == 3


@pytest.mark.parametrize("chunk", [2, 0], ids=["chunked", "whole"])
def test_chunked_loss_equals_transformers_loss_and_gradients(chunk):
    """Chunks of 2 (3 chunks over 6 trained positions), or the whole logits' loss (WholeLoss,
    what train.compile compiles): transformers' loss and gradients."""
    from paratrain.data.text.data import Collate
    from paratrain.models.causal_lm.build import build_causal_lm
    from paratrain.models.causal_lm.lora import LoraConfig, apply_lora
    from paratrain.models.causal_lm.loss import ChunkedLossLM

    torch.manual_seed(0)
    model = apply_lora(build_causal_lm(None, "random", "tiny", "sdpa", torch.float32), LoraConfig())
    model.config.use_cache = False
    for (
        p
    ) in model.parameters():  # non-zero adapters (B starts at 0), so every gradient is non-trivial
        if p.requires_grad:
            p.data.normal_(0, 0.02)
    batch = Collate(258, packed=False)(
        [([256, 5, 6, 7, 8, 9], [-100, -100, 6, 7, 8, 9]), ([256, 1, 2], [-100, 2, 3])]
    )
    inputs = {k: v for k, v in batch.items() if k != "num_tokens"}
    ref = model(**inputs).loss
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    chunked = ChunkedLossLM(model, chunk=chunk)(**inputs).loss
    chunked.backward()
    torch.testing.assert_close(chunked, ref)
    for n, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, ref_grads[n], msg=n)


def test_chunked_loss_trains_and_saves_the_adapter(tmp_path):
    data = write_alpaca(tmp_path / "alpaca.json")
    run = tmp_path / "run"
    result = train(
        load_config(
            None,
            lm_settings(data)
            + ["train.max_steps=4", "model.loss_chunk_tokens=64", f"output_dir={run}"],
        )
    )
    assert (
        result["summary"]["optimizer_steps"] == 4
        and (run / "adapter" / "adapter_config.json").is_file()
    )


def test_compile_is_regional_and_trains_like_eager(tmp_path, monkeypatch):
    """train.compile on a language model compiles each decoder layer and the chunked loss in
    place (names and checkpoints unchanged) and follows the eager run's losses. Dynamo's graphs
    run through AOT autograd without inductor's C++ code generation (aot_eager): what is
    compiled, and where, is the question here; inductor's kernels are the GPU tests' (3 minutes
    of the suite on 2 cores with it)."""
    from paratrain.config.train import TrainConfig

    monkeypatch.setattr(TrainConfig, "compile_kwargs", lambda self, **kw: {"backend": "aot_eager"})
    seen = capture_workload(monkeypatch)
    data = write_alpaca(tmp_path / "alpaca.json")
    common = lm_settings(data) + [
        "train.max_steps=3",
        "train.eval=false",
        "model.loss_chunk_tokens=64",
    ]
    eager = train(load_config(None, common + [f"output_dir={tmp_path / 'eager'}"]))
    compiled = train(
        load_config(None, common + ["train.compile=true", f"output_dir={tmp_path / 'compiled'}"])
    )
    blocks = seen["work"].compile_units
    assert len(blocks) == 4  # the tiny shape's two decoder layers, the final norm, the chunk loss
    assert all(b._compiled_call_impl is not None for b in blocks)
    a, b = eager["summary"]["train_loss"], compiled["summary"]["train_loss"]
    assert abs(a - b) < 1e-3 * abs(a), (a, b)
    ckpt = read_ckpt(last_checkpoint(tmp_path / "compiled"))
    assert not any("_orig_mod" in k for k in ckpt["model"])
    # the whole decoder as one graph: the same losses, the same checkpoint names
    whole = common + ["train.compile=true", "train.compile_scope=decoder"]
    decoder = train(load_config(None, whole + [f"output_dir={tmp_path / 'decoder'}"]))
    units = seen["work"].compile_units
    assert [type(u).__name__ for u in units] == ["LlamaModel", "ChunkLoss"]
    assert units[0]._compiled_call_impl is not None
    rotary = units[0].rotary_emb  # eager inside the graph, bound to its own module
    assert (
        rotary.forward.__self__ is rotary and copy.deepcopy(rotary).forward.__self__ is not rotary
    )
    c = decoder["summary"]["train_loss"]
    assert abs(a - c) < 1e-3 * abs(a), (a, c)
    ckpt = read_ckpt(last_checkpoint(tmp_path / "decoder"))
    assert not any("_orig_mod" in k for k in ckpt["model"])


@pytest.mark.parametrize(
    "settings, says",
    [
        (["train.compile=true", "strategy=fsdp"], "one process (strategy single)"),
        (["train.compile=true", "strategy=ddp-ds", "launch.nproc=2"], "DDP splits"),
        ([], "set train.compile=true"),
        (["train.compile=true", "model.name=tiny_cnn", "data.source=synthetic"], "task causal_lm"),
    ],
)
def test_compile_scope_decoder_refusals(settings, says):
    from paratrain.errors import UserError
    from paratrain.runplan import resolve

    lm = ["model.shape=tiny", "model.init=random", "data.source=synthetic-text"]
    base = [] if "model.name=tiny_cnn" in settings else lm
    cfg = load_config(None, [*base, "device=cpu", "train.compile_scope=decoder", *settings])
    with pytest.raises(UserError) as e:
        resolve(cfg, given=("strategy",))
    assert str(e.value).startswith("train.compile_scope: decoder:") and says in str(e.value)


def test_liger_kernels_off_cuda_is_a_one_line_error(tmp_path):
    import pytest

    from paratrain.errors import UserError

    data = write_alpaca(tmp_path / "alpaca.json")
    cfg = load_config(None, lm_settings(data) + ["model.kernels=liger", f"output_dir={tmp_path}"])
    with pytest.raises(UserError, match="model.kernels: liger runs Triton kernels on CUDA"):
        train(cfg)  # checked again in the worker: a run under an outside torchrun skips preflight


def test_sdpa_backend_sets_the_kernel_priority_for_the_run(tmp_path, monkeypatch):
    from torch.nn.attention import SDPBackend, _cur_sdpa_kernel_backends

    from paratrain.trainer.measure import sdpa_priority

    before = _cur_sdpa_kernel_backends(with_priority=True)
    with sdpa_priority("cudnn"):
        order = _cur_sdpa_kernel_backends(with_priority=True)
        assert order[0] == SDPBackend.CUDNN_ATTENTION and SDPBackend.MATH in order  # fallbacks
    assert _cur_sdpa_kernel_backends(with_priority=True) == before

    seen = []
    loss = lm_task.build

    def spy(*args, **kwargs):
        seen.append(_cur_sdpa_kernel_backends(with_priority=True)[0])
        return loss(*args, **kwargs)

    monkeypatch.setattr(lm_task, "TASK", dataclasses.replace(lm_task.TASK, build=spy))
    data = write_alpaca(tmp_path / "alpaca.json")
    cfg = load_config(
        None,
        lm_settings(data)
        + ["train.max_steps=2", "train.sdpa_backend=efficient", f"output_dir={tmp_path}"],
    )
    assert train(cfg)["summary"]["optimizer_steps"] == 2  # the CPU falls back to its own kernel
    assert seen == [SDPBackend.EFFICIENT_ATTENTION]


def test_fp8_base_layers_train_the_adapters_like_full_precision(tmp_path, monkeypatch):
    """model.fp8: the frozen decoder linears become float8 layers (torchao's, cast once:
    fp8_frozen.py; lm_head stays), peft's adapters wrap them, only the adapters change, and the
    loss follows the fp32 run."""
    import pytest

    pytest.importorskip("torchao")
    from paratrain.models.causal_lm.fp8_frozen import FrozenFloat8Linear as Float8Linear

    seen = capture_workload(monkeypatch)
    data = write_alpaca(tmp_path / "alpaca.json")
    common = lm_settings(data) + ["train.max_steps=4", "train.eval=false"]
    plain = train(load_config(None, common + [f"output_dir={tmp_path / 'plain'}"]))
    fp8 = train(load_config(None, common + ["model.fp8=rowwise", f"output_dir={tmp_path / 'fp8'}"]))
    model = seen["model"]
    f8 = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert any(n.endswith("q_proj.base_layer") for n in f8) and any("mlp" in n for n in f8)
    assert not any("lm_head" in n for n in f8)
    after = dict(model.named_parameters())
    changed = {n for n, b in seen["before"].items() if not torch.equal(b, after[n])}
    assert changed and all("lora_" in n for n in changed)
    a, b = plain["summary"]["train_loss"], fp8["summary"]["train_loss"]
    assert abs(a - b) < 0.05 * a and a != b, (a, b)  # float8 rounding, not another model
    assert fp8["workload"]["fp8"] == "rowwise"


def test_frozen_fp8_layers_train_as_torchao_does_bit_for_bit(tmp_path, monkeypatch):
    """LoRA's frozen base weights cast to float8 once (fp8_frozen.py) give the same losses and
    adapters as torchao's Float8Linear casting them every step: same scales, same values."""
    import pytest

    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    from paratrain.models.causal_lm.fp8_frozen import FrozenFloat8Linear

    data = write_alpaca(tmp_path / "alpaca.json")
    common = lm_settings(data) + ["train.max_steps=3", "train.eval=false", "model.fp8=tensorwise"]
    seen = capture_workload(monkeypatch)
    once = train(load_config(None, common + [f"output_dir={tmp_path / 'once'}"]))
    kinds = {type(m) for m in seen["model"].modules()}
    assert FrozenFloat8Linear in kinds and Float8Linear not in kinds
    adapters_once = {
        n: p.detach().clone() for n, p in seen["model"].named_parameters() if p.requires_grad
    }
    monkeypatch.setattr(
        lm_task, "freeze_fp8", lambda model, *a: model
    )  # torchao's layers as they are
    each = train(load_config(None, common + [f"output_dir={tmp_path / 'each'}"]))
    kinds = {type(m) for m in seen["model"].modules()}
    assert Float8Linear in kinds and FrozenFloat8Linear not in kinds
    adapters_each = {n: p.detach() for n, p in seen["model"].named_parameters() if p.requires_grad}
    assert once["summary"]["train_loss"] == each["summary"]["train_loss"]
    assert adapters_once.keys() == adapters_each.keys()
    assert all(torch.equal(adapters_once[n], adapters_each[n]) for n in adapters_once)
    changed = [n for n in adapters_once if not torch.equal(adapters_once[n], seen["before"][n])]
    assert changed  # the adapters trained: not two runs that did nothing


def test_frozen_fp8_copies_follow_the_layer_to_another_device():
    """strategy split moves layers to other GPUs after the build: the float8 copies (plain
    attributes, not Parameters) are made again where the weight went."""
    import pytest

    pytest.importorskip("torchao")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from paratrain.models.causal_lm.fp8_frozen import freeze_fp8

    m = torch.nn.Sequential(torch.nn.Linear(32, 64, bias=False)).requires_grad_(False)
    convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name("tensorwise"))
    layer = freeze_fp8(m)[0]
    assert layer._out_data.dtype == torch.float8_e4m3fn
    m.to("meta")
    copies = (layer._out_data, layer._out_scale, layer._gin_data, layer._gin_scale)
    assert layer.weight.is_meta and all(t.is_meta for t in copies)


def test_fused_kernels_and_fp8_name_their_missing_package(monkeypatch):
    import sys

    import pytest

    from paratrain.errors import UserError
    from paratrain.models.causal_lm.fast_layers import check_fp8, check_kernels

    monkeypatch.setitem(sys.modules, "torchao", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    with pytest.raises(UserError, match=r"model.fp8: rowwise needs the torchao package"):
        check_fp8("rowwise", "cpu")
    with pytest.raises(UserError, match=r"model.kernels: liger needs the liger-kernel package"):
        check_kernels("liger", "cuda")
    check_fp8("none", "cpu")
    check_kernels("none", "cpu")


def test_compiled_fp8_layers_skip_the_frozen_weights_gradient():
    """Why model.fp8 wants train.compile: torchao's backward computes a weight gradient even for a
    frozen weight (3 float8 matmuls per layer); compiled, the unused one is dropped (2)."""
    import pytest

    pytest.importorskip("torchao")
    from torch.profiler import ProfilerActivity, profile
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def matmuls(compiled: bool) -> int:
        torch.manual_seed(0)
        m = torch.nn.Sequential(
            torch.nn.Linear(64, 128, bias=False), torch.nn.Linear(128, 64, bias=False)
        )
        m.requires_grad_(False)
        convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name("rowwise"))
        if compiled:
            for layer in m:
                layer.compile()
        x = torch.randn(32, 64, requires_grad=True)
        for _ in range(2):  # compile, warm up
            m(x).square().sum().backward()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            m(x).square().sum().backward()
        return sum(e.count for e in prof.key_averages() if "scaled_mm" in e.key)

    assert matmuls(compiled=False) == 6 and matmuls(compiled=True) == 4


def test_fp8_with_packed_rows_needs_max_length_a_multiple_of_16(tmp_path):
    import pytest

    from paratrain.errors import UserError

    data = write_alpaca(tmp_path / "alpaca.json")
    settings = ["model.fp8=rowwise", "data.packing=true", "data.max_length=250"]
    cfg = load_config(None, lm_settings(data) + settings + [f"output_dir={tmp_path}"])
    with pytest.raises(UserError, match="data.max_length: 250 is not a multiple of 16"):
        train(cfg)


def test_model_flops_count_a_tied_lm_head_as_the_matmul_it_is():
    """Tied or not, the lm_head is a vocabulary x hidden matmul per token: the same shape gives
    the same FLOPs either way (before, a tied lm_head was left out: Llama-3.2-1B's MFU read
    ~19% low). And the count is 6 x the matmul weights + attention, by hand."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from paratrain.models.causal_lm.build import SHAPES
    from paratrain.models.causal_lm.spec import CausalLMSpec

    shape = {**SHAPES["tiny"]}
    counts = {}
    for tied in (False, True):
        model = LlamaForCausalLM(LlamaConfig(**{**shape, "tie_word_embeddings": tied}))
        counts[tied] = CausalLMSpec().flops_per_token(model, seq_len=32, lora=False)
    v, h, layers = shape["vocab_size"], shape["hidden_size"], shape["num_hidden_layers"]
    model = LlamaForCausalLM(LlamaConfig(**{**shape, "tie_word_embeddings": False}))
    matmuls = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    assert counts[True] == counts[False] == 6 * matmuls + 12 * layers * h * 32
    assert matmuls > v * h  # the lm_head is in it


def test_the_compiled_loss_takes_only_a_plain_lm_head():
    """WholeLoss computes hidden @ lm_head.weight.T: only where that is all lm_head does. A bias,
    LoRA on lm_head or the config's logit soft-capping keep the model's own loss."""
    import torch
    from peft import LoraConfig, get_peft_model

    from paratrain.models.causal_lm.build import build_causal_lm
    from paratrain.models.causal_lm.loss import plain_head

    def tiny():
        return build_causal_lm(None, "random", "tiny", "sdpa", torch.float32, "cpu")

    assert plain_head(tiny())
    biased = tiny()
    biased.lm_head = torch.nn.Linear(biased.lm_head.in_features, biased.lm_head.out_features)
    assert not plain_head(biased)
    capped = tiny()
    capped.config.final_logit_softcapping = 30.0
    assert not plain_head(capped)
    adapted = get_peft_model(tiny(), LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))
    assert not plain_head(adapted)
    assert plain_head(get_peft_model(tiny(), LoraConfig(r=2, target_modules=["q_proj"])))


def test_fp8_lm_head_puts_the_logits_matmul_in_float8():
    """model.fp8_lm_head: lm_head becomes torchao's Float8Linear, and the compiled-loss wrapper
    calls that layer (not hidden @ weight.T in high precision): its loss is the model's own loss
    through the float8 head, not the high-precision head's, and lm_head's weight trains."""
    import pytest

    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    from paratrain.models.causal_lm.build import build_causal_lm
    from paratrain.models.causal_lm.fast_layers import apply_fp8
    from paratrain.models.causal_lm.loss import ChunkedLossLM, float8_head, plain_head

    torch.manual_seed(0)
    base = build_causal_lm(None, "random", "tiny", "sdpa", torch.float32, "cpu")
    ids = torch.randint(0, base.config.vocab_size, (2, 32))
    with torch.no_grad():
        high = base(input_ids=ids, labels=ids).loss
    model = apply_fp8(base, "tensorwise", torch.device("cpu"), lm_head=True)
    assert isinstance(model.lm_head, Float8Linear)
    assert float8_head(model) and not plain_head(model)
    wrapped = ChunkedLossLM(model, 0)
    loss = wrapped(input_ids=ids, labels=ids).loss
    own = model(input_ids=ids, labels=ids).loss  # transformers' loss through the same layer
    torch.testing.assert_close(loss, own)
    assert loss.item() != high.item()  # float8's rounding: the head did multiply in float8
    assert abs(loss.item() - high.item()) < 0.02 * high.item()
    loss.backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    # a head float8 matmuls cannot take (a size not a multiple of 16) is refused, not kept bf16
    from paratrain.errors import UserError

    odd = build_causal_lm(None, "random", "tiny", "sdpa", torch.float32, "cpu")
    odd.lm_head = torch.nn.Linear(odd.lm_head.in_features, 321, bias=False)
    with pytest.raises(UserError, match=r"model.fp8_lm_head: lm_head \(\d+ x 321\)"):
        apply_fp8(odd, "tensorwise", torch.device("cpu"), lm_head=True)


def test_delayed_fp8_lm_head_trains_through_the_loss_wrapper():
    """model.fp8=delayed with model.fp8_lm_head: lm_head becomes fp8_delayed's layer, the
    loss wrapper calls it, its gradient's amax reaches the history, and the loss tracks the
    high-precision head's (compiled, on the GPU: benchmarks/results/2026-12-03-h200x1/issue34)."""
    import pytest

    pytest.importorskip("torchao")
    from paratrain.models.causal_lm.build import build_causal_lm
    from paratrain.models.causal_lm.fast_layers import apply_fp8
    from paratrain.models.causal_lm.fp8_delayed import DelayedFloat8Linear, delay_fp8
    from paratrain.models.causal_lm.loss import ChunkedLossLM, float8_head

    torch.manual_seed(0)
    base = build_causal_lm(None, "random", "tiny", "sdpa", torch.float32, "cpu")
    ids = torch.randint(0, base.config.vocab_size, (2, 32))
    with torch.no_grad():
        high = base(input_ids=ids, labels=ids).loss.item()
    model = delay_fp8(apply_fp8(base, "delayed", torch.device("cpu"), lm_head=True))
    assert isinstance(model.lm_head, DelayedFloat8Linear) and float8_head(model)
    wrapped = ChunkedLossLM(model, 0)
    for step in range(3):
        loss = wrapped(input_ids=ids, labels=ids).loss
        loss.backward()
        assert abs(loss.item() - high) < 0.02 * high, step
        model.zero_grad()
    head = model.lm_head
    assert head.calibrated and (head.g_history[:3] > 0).all() and (head.x_history[:3] > 0).all()


def test_the_precision_label_names_a_float8_lm_head():
    from paratrain.trainer.result import precision_label

    assert precision_label({"precision": "bf16", "fp8": None}) == "bf16"
    assert precision_label({"precision": "bf16", "fp8": "rowwise"}) == "bf16+fp8-rowwise"
    both = {"precision": "bf16", "fp8": "tensorwise", "fp8_lm_head": True}
    assert precision_label(both) == "bf16+fp8-tensorwise+lm_head"


def test_fp8_lm_head_needs_fp8():
    import pytest

    from paratrain.errors import ConfigError

    with pytest.raises(ConfigError, match="fp8_lm_head: needs model.fp8"):
        load_config(None, ["task=causal_lm", "model.fp8_lm_head=true", "model.shape=tiny"])


def test_delayed_fp8_starts_as_torchao_then_scales_from_the_history():
    """model.fp8=delayed (fp8_delayed.py): the first step casts as torchao's tensorwise recipe
    does (bit for bit); later casts take the amax history's scale: the same values while the
    tensors' amax stays (or moves by a power of two), other values when it moves otherwise. The
    history holds each step's amax; the state dict keeps torchao's keys."""
    import copy

    import pytest

    pytest.importorskip("torchao")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from paratrain.models.causal_lm.fp8_delayed import DelayedFloat8Linear, delay_fp8

    torch.manual_seed(0)
    base = torch.nn.Sequential(
        torch.nn.Linear(64, 128, bias=False), torch.nn.ReLU(), torch.nn.Linear(128, 32, bias=False)
    )
    config = Float8LinearConfig.from_recipe_name("tensorwise")
    ref = convert_to_float8_training(copy.deepcopy(base), config=config)
    delayed = delay_fp8(convert_to_float8_training(copy.deepcopy(base), config=config))
    assert all(isinstance(delayed[i], DelayedFloat8Linear) for i in (0, 2))
    assert delayed.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(32, 64)
    same = []
    for factor in (1.0, 1.0, 0.5, 0.7):
        xd, xr = (x * factor).requires_grad_(), (x * factor).requires_grad_()
        a, b = delayed(xd), ref(xr)
        (a * a).sum().backward()
        (b * b).sum().backward()
        grads = [
            (p.grad, q.grad) for p, q in zip(delayed.parameters(), ref.parameters(), strict=True)
        ]
        same.append(
            torch.equal(a, b)
            and torch.equal(xd.grad, xr.grad)
            and all(torch.equal(*g) for g in grads)
        )
        if factor == 0.7:
            torch.testing.assert_close(a, b, rtol=0.1, atol=0.05)  # float8's rounding, no more
        for p in list(delayed.parameters()) + list(ref.parameters()):
            p.grad = None
    assert same == [True, True, True, False]
    first = delayed[0]
    assert first.calibrated and first._sink.grad is None
    amax = x.abs().amax()
    expected = torch.stack([amax * 0.7, amax * 0.5, amax, amax]).float()
    torch.testing.assert_close(first.x_history[:4], expected)
    assert (first.g_history[:4] > 0).all() and not first.g_history[4:].any()
    with torch.no_grad():  # evaluation leaves the history alone
        delayed(x * 3)
    torch.testing.assert_close(first.x_history[:4], expected)


def test_delayed_fp8_layers_fed_one_tensor_share_one_history():
    """q/k/v (and gate/up) read their first layer's input history, which alone records the
    input's amax: the same scales as a history each, so the same losses and gradients bit for
    bit; under LoRA the wrapped base layers are grouped the same way."""
    import copy

    import pytest

    pytest.importorskip("torchao")
    from paratrain.config.model import LoraConfig
    from paratrain.models.causal_lm.build import build_causal_lm
    from paratrain.models.causal_lm.fast_layers import apply_fp8
    from paratrain.models.causal_lm.fp8_delayed import DelayedFrozenFloat8Linear, delay_fp8
    from paratrain.models.causal_lm.fp8_frozen import freeze_fp8
    from paratrain.models.causal_lm.lora import apply_lora

    torch.manual_seed(0)
    base = build_causal_lm(None, "random", "tiny", "sdpa", torch.float32, "cpu")
    shared = delay_fp8(apply_fp8(copy.deepcopy(base), "delayed", torch.device("cpu")))
    own = delay_fp8(apply_fp8(copy.deepcopy(base), "delayed", torch.device("cpu")))
    for m in own.modules():
        if hasattr(m, "_x_from"):
            m._x_from = (m,)
    attn, mlp = shared.model.layers[0].self_attn, shared.model.layers[0].mlp
    assert attn.k_proj._x_from[0] is attn.q_proj and attn.v_proj._x_from[0] is attn.q_proj
    assert mlp.up_proj._x_from[0] is mlp.gate_proj and attn.o_proj._x_from[0] is attn.o_proj
    ids = torch.randint(0, base.config.vocab_size, (2, 32))
    for step in range(3):
        losses = []
        for model in (shared, own):
            loss = model(input_ids=ids, labels=ids * (step + 1) % base.config.vocab_size).loss
            loss.backward()
            losses.append((loss, [p.grad.clone() for p in model.parameters()]))
            model.zero_grad()
        (a, ga), (b, gb) = losses
        assert torch.equal(a, b) and all(map(torch.equal, ga, gb)), step
    assert attn.q_proj.x_history[:3].gt(0).all() and not attn.k_proj.x_history.any()
    assert attn.k_proj.calibrated and attn.k_proj.g_history[:3].gt(0).all()
    # LoRA: peft's wrappers hold the frozen float8 layers as base_layer
    lora = apply_lora(
        apply_fp8(copy.deepcopy(base).requires_grad_(False), "delayed", torch.device("cpu")),
        LoraConfig(enabled=True),
    )
    lora = delay_fp8(freeze_fp8(lora, DelayedFrozenFloat8Linear))
    attn = lora.get_base_model().model.layers[0].self_attn
    q, k, v = attn.q_proj.base_layer, attn.k_proj, attn.v_proj.base_layer  # k: no adapter
    assert isinstance(v, DelayedFrozenFloat8Linear) and v._x_from[0] is q and k._x_from[0] is q


def test_delayed_fp8_histories_skip_unusable_amaxes_and_survive_a_copy():
    """A step whose gradients overflow (inf) enters the histories as 0: the next steps stay
    finite and scale from the steps before. A layer waits for a positive amax (not a batch with
    no trained token) before it delays its casts. A deep copy keeps recording."""
    import copy

    import pytest

    pytest.importorskip("torchao")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from paratrain.models.causal_lm.fp8_delayed import delay_fp8

    torch.manual_seed(0)
    base = torch.nn.Sequential(
        torch.nn.Linear(64, 128, bias=False), torch.nn.ReLU(), torch.nn.Linear(128, 32, bias=False)
    )
    config = Float8LinearConfig.from_recipe_name("tensorwise")
    model = delay_fp8(convert_to_float8_training(base, config=config))
    x = torch.randn(32, 64)

    def step(factor: float) -> bool:
        out = model(x)
        (out.square().sum() * factor).backward()
        finite = all(p.grad.isfinite().all() for p in model.parameters())
        model.zero_grad(set_to_none=True)
        return finite

    step(0.0)  # every gradient zero: nothing to scale from yet
    assert not model[2].calibrated and not model[2].g_history.any()
    step(1.0)
    assert model[2].calibrated
    kept = model[2].g_history.clone()
    step(float("inf"))  # an overflowed step
    assert model[2].g_history[0] == 0 and torch.equal(model[2].g_history[1:], kept[:-1])
    assert all(step(1.0) for _ in range(3))  # torchao's recipe: only the bad step is bad
    clone = copy.deepcopy(model)
    before = clone[0].x_history.clone()
    out = clone(x * 2)
    out.square().sum().backward()
    assert clone[0].x_history[0] > before[0] and clone[0]._sink.grad is None


def test_delayed_fp8_frozen_layers_start_as_fp8_frozen_then_use_the_history():
    """Under LoRA, model.fp8=delayed keeps fp8_frozen's once-cast weights and scales the input's
    and the gradient's casts from their histories: the first steps equal fp8_frozen's layers bit
    for bit, eager and compiled; an amax moved by 0.7x gives other values."""
    import copy

    import pytest

    pytest.importorskip("torchao")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from paratrain.models.causal_lm.fp8_delayed import DelayedFrozenFloat8Linear
    from paratrain.models.causal_lm.fp8_frozen import freeze_fp8

    torch.manual_seed(0)
    base = torch.nn.Sequential(
        torch.nn.Linear(64, 128, bias=False), torch.nn.ReLU(), torch.nn.Linear(128, 32, bias=False)
    ).requires_grad_(False)
    config = Float8LinearConfig.from_recipe_name("tensorwise")
    base = convert_to_float8_training(base, config=config)
    for compiled in (False, True):
        ref = freeze_fp8(copy.deepcopy(base))
        delayed = freeze_fp8(copy.deepcopy(base), DelayedFrozenFloat8Linear)
        assert isinstance(delayed[0], DelayedFrozenFloat8Linear)
        runs = [torch.compile(m) if compiled else m for m in (delayed, ref)]
        x, same = torch.randn(32, 64), []
        for factor in (1.0, 1.0, 0.7):
            xd, xr = (x * factor).requires_grad_(), (x * factor).requires_grad_()
            a, b = runs[0](xd), runs[1](xr)
            (a * a).sum().backward()
            (b * b).sum().backward()
            same.append(torch.equal(a, b) and torch.equal(xd.grad, xr.grad))
        assert same == [True, True, False], compiled
        assert delayed[2].calibrated and (delayed[2].g_history[:3] > 0).all()
