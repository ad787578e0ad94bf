"""Plain transformers + peft LoRA fine-tuning, written the way their documentation shows: the
baseline paratrain's LoRA is measured against. A Llama or GPT-2 built from the config's shape (random weights) in the
autocast dtype, get_peft_model, AdamW on the adapters, autocast, model(...).loss, DDP when
torchrun starts several processes. paratrain's synthetic-text rows (random tokens, every token
trained), in the order paratrain's sampler gives them: the same batches as `paratrain run`, so
that the two loss curves can be laid over each other (result.json's summary.losses, one per
step, against paratrain's steps.jsonl at log.every_steps=1).

With lora.enabled=false, plain full training (full training's baseline): the weights in fp32 under
bf16 autocast (paratrain's bf16), AdamW on all of them; train.compile=true adds what a user
adds by hand, torch.compile on each decoder layer, and train.fused_optimizer=true fused AdamW.

    python -m torch.distributed.run --standalone --nproc-per-node=N \
        -m paratrain.bench.peers.hf_lora CONFIG_YAML OUT_DIR
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from paratrain.bench.peers import common
from paratrain.data.samplers import build_sampler


def main() -> None:
    plan, out_dir = common.read_plan("hf_lora")
    cfg = plan.config
    check_supported(cfg)
    rank, local_rank, world_size = common.world()
    device = common.pick_device(cfg, local_rank)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    torch.manual_seed(cfg.seed)
    model, config = build_model(cfg, dtype, device)
    if dist.is_initialized():
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    summary = train_measured(plan, model, config.vocab_size, device, dtype, rank, world_size)
    if rank == 0:
        common.write_result(out_dir, "hf_lora", cfg, device, world_size, summary)
    if dist.is_initialized():
        dist.destroy_process_group()


def train_measured(plan, model, vocab: int, device, dtype, rank: int = 0, world: int = 1) -> dict:
    """The documentation's training of `model` (AdamW on its trained weights, train_steps) over
    paratrain's synthetic rows in its sampler's order -> the meter's summary of the steps after
    warm-up, tokens beside samples. The Unsloth peer trains its model with it too."""
    cfg = plan.config
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.train.lr,
        fused=cfg.train.fused_optimizer or None,
    )
    batch, length = cfg.data.batch_size, cfg.data.max_length
    rows = synthetic_rows(cfg, vocab)
    sampler = build_sampler(
        plan.layout.sampler, len(rows), rank=rank, world=world, shuffle=cfg.data.shuffle,
        seed=cfg.seed,
    )  # fmt: skip
    if len(sampler) < batch:  # no step would ever be taken
        common.fail(
            f"data.batch_size: {len(sampler)} rows per rank are fewer than one batch ({batch})"
        )
    total = cfg.train.max_steps or 30
    meter = common.Meter(device, cfg.train.warmup_steps, total, keep_losses=True)
    train_steps(model, optimizer, rows, sampler, meter, batch, dtype, cfg.train.max_grad_norm)
    summary = meter.summary(batch, world)
    add_tokens(summary, length, batch * length * world)
    return summary


def check_supported(cfg) -> None:
    """What this baseline implements; anything else exits 2 before any work."""
    if (
        cfg.data.source != "synthetic-text"
        or cfg.model.path is not None
        or cfg.precision not in ("bf16", "fp32")
    ):
        common.fail(
            "hf_lora: runs data.source=synthetic-text, model.init=random with a shape, bf16 or fp32"
        )


def build_model(cfg, dtype: torch.dtype, device: torch.device):
    """-> (the model as the documentation builds it, its transformers config): random weights
    of the config's shape, LoRA adapters by get_peft_model unless lora.enabled=false, then what
    a user switches on by hand (gradient checkpointing, torch.compile per decoder layer)."""
    from peft import LoraConfig, get_peft_model

    from paratrain.models.causal_lm.build import building, decoder_layers, model_class, shape_config
    from paratrain.models.causal_lm.family import family_of
    from paratrain.models.causal_lm.lora import lora_targets

    config = shape_config(cfg.model.shape, cfg.model.layers, cfg.model.attn_implementation)
    config.use_cache = False
    if cfg.model.kernels != "none":
        apply_liger(config.model_type, loss_only=cfg.model.kernels == "liger-loss")
    full = not cfg.lora.enabled
    # full training keeps fp32 master weights (autocast computes in bf16); LoRA's frozen base
    # lives in the autocast dtype
    with building(torch.float32 if full else dtype, device):
        model = model_class(config)(config)
    if not full:
        lora = LoraConfig(
            r=cfg.lora.r,
            lora_alpha=cfg.lora.alpha,
            lora_dropout=cfg.lora.dropout,
            target_modules=lora_targets(config, cfg.lora),  # the family's default when unset
            fan_in_fan_out=family_of(config).conv1d,  # GPT-2's Conv1D weights are [in, out]
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    if cfg.train.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if not full:
            model.enable_input_require_grads()
    if cfg.train.compile:
        for layer in decoder_layers(model):
            layer.compile()
    return model, config


def apply_liger(model_type: str, loss_only: bool) -> None:
    """transformers + peft + Liger, as Liger's documentation shows: its patch of the model
    family's modules before the model is built (RMSNorm, RoPE, SwiGLU and the fused linear
    cross-entropy in model(...).loss; liger-loss: the loss alone)."""
    common.require("liger_kernel")
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    patch = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if patch is None:
        common.fail(f"model.kernels: liger-kernel has no kernels for model type {model_type!r}")
    if loss_only:
        patch(rope=False, rms_norm=False, swiglu=False, fused_linear_cross_entropy=True)
    else:
        patch(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=True)


def train_steps(
    model, optimizer, rows, sampler, meter: common.Meter, batch: int, dtype, max_norm=None
) -> None:
    """The documentation's loop: the meter's total steps over the sampler's order, epoch after
    epoch, the last short batch of each dropped (as paratrain's loader drops it); gradients
    clipped by clip_grad_norm_ when train.max_grad_norm is set."""
    trained = [p for p in model.parameters() if p.requires_grad]
    device, total = meter.device, meter.total
    model.train()
    meter.start()
    epoch = 0
    while meter.steps < total:
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        for first in range(0, len(order) - batch + 1, batch):  # drop_last, as paratrain
            if meter.steps == total:
                break
            ids = rows[order[first : first + batch]].to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            if max_norm is not None:
                torch.nn.utils.clip_grad_norm_(trained, max_norm, foreach=True)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            meter.step(loss)
        epoch += 1


def add_tokens(summary: dict, length: int, tokens_per_step: int) -> None:
    """Tokens beside samples in the summary (every row is `length` tokens: no padding in the
    synthetic rows), energy per token too when it was measured."""
    summary["tokens_per_s"] = summary["unique_samples_per_s"] * length
    summary["tokens_per_step"] = tokens_per_step
    if summary["energy"]:
        e = summary["energy"]
        e["joules_per_token"] = e["joules_per_sample"] / length
        e["tokens_per_kwh"] = e["samples_per_kwh"] * length


def synthetic_rows(cfg, vocab: int) -> torch.Tensor:
    """paratrain's synthetic-text rows (the byte tokenizer's ids), as one [rows, length] tensor."""
    from paratrain.data.text import data as lmdata
    from paratrain.data.text.tokenizer import load_tokenizer
    from paratrain.tasks.causal_lm import SYNTHETIC_ROWS

    n_ids = min(vocab, len(load_tokenizer(None)))
    examples = lmdata.synthetic_examples(SYNTHETIC_ROWS, cfg.data.max_length, n_ids, cfg.seed)
    return torch.tensor([ids for ids, _ in examples])


if __name__ == "__main__":
    main()
