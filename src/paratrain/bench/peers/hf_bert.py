"""Plain transformers masked-LM training, written the way their documentation shows it: a
BertForMaskedLM from the config's shape (random weights, fp32 under bf16 autocast), transformers'
own DataCollatorForLanguageModeling (15% of tokens, 80/10/10) in the DataLoader, AdamW,
model(**batch).loss, DDP when torchrun starts several processes; train.compile=true compiles
each encoder layer (what a user adds by hand), train.fused_optimizer=true fuses AdamW. The rows
are paratrain's synthetic-text rows for BERT (random bytes between [CLS] and [SEP], every row
full): the baseline of the BERT case study.

    python -m torch.distributed.run --standalone --nproc-per-node=N \
        -m paratrain.bench.peers.hf_bert CONFIG_YAML OUT_DIR
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from paratrain.bench.peers import common


def main() -> None:
    plan, out_dir = common.read_plan("hf_bert")
    cfg = plan.config
    check_supported(plan)
    rank, local_rank, world_size, device = common.start(cfg)
    model = build_model(cfg, device)
    if dist.is_initialized():
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.train.lr, fused=cfg.train.fused_optimizer or None
    )
    sampler, loader = build_loader(cfg, rank, world_size, device)
    length = cfg.data.max_length
    dtype = torch.bfloat16 if cfg.precision == "bf16" else None
    total = cfg.train.max_steps or 30
    meter = common.Meter(device, cfg.train.warmup_steps, total)
    train_steps(model, optimizer, sampler, loader, meter, dtype)
    summary = meter.summary(cfg.data.batch_size, world_size)
    summary["tokens_per_s"] = summary["unique_samples_per_s"] * length  # every row is full
    summary["tokens_per_step"] = cfg.data.batch_size * length * world_size
    if rank == 0:
        common.write_result(out_dir, "hf_bert", cfg, device, world_size, summary)
    if dist.is_initialized():
        dist.destroy_process_group()


def check_supported(plan) -> None:
    """What this baseline implements; anything else exits 2 before any work."""
    cfg = plan.config
    if plan.task != "masked_lm" or cfg.data.source != "synthetic-text" or cfg.model.path:
        common.fail("hf_bert: runs task=masked_lm, data.source=synthetic-text, a random shape")
    if cfg.precision not in ("bf16", "fp32"):
        common.fail("hf_bert: precision bf16 or fp32")


def build_model(cfg, device: torch.device):
    """A BertForMaskedLM of the config's shape (random weights, fp32), each encoder layer
    compiled when train.compile=true (what a user adds by hand)."""
    from transformers import BertConfig, BertForMaskedLM

    from paratrain.models.bert import SHAPES

    config = BertConfig(**SHAPES[cfg.model.shape])
    config._attn_implementation = cfg.model.attn_implementation
    model = BertForMaskedLM(config).to(device)
    if cfg.train.compile:
        for layer in model.bert.encoder.layer:
            layer.compile()
    return model


def build_loader(cfg, rank: int, world_size: int, device: torch.device):
    """-> (sampler, loader): paratrain's synthetic rows for BERT (random bytes between [CLS] and
    [SEP], every row full), masked by transformers' own collator, as the documentation loads
    them."""
    from transformers import DataCollatorForLanguageModeling

    from paratrain.data.text.tokenizer import bert_byte_tokenizer
    from paratrain.tasks.masked_lm import SYNTHETIC_ROWS

    tokenizer = bert_byte_tokenizer()
    length = cfg.data.max_length
    g = torch.Generator().manual_seed(cfg.seed)
    body = torch.randint(0, 256, (SYNTHETIC_ROWS, length - 2), generator=g)
    rows = [
        {"input_ids": [tokenizer.cls_token_id, *r, tokenizer.sep_token_id]} for r in body.tolist()
    ]
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    sampler = DistributedSampler(rows, world_size, rank, shuffle=True, seed=cfg.seed)
    loader = DataLoader(
        rows,
        batch_size=cfg.data.batch_size,
        sampler=sampler,
        collate_fn=collator,
        num_workers=cfg.data.num_workers,
        pin_memory=cfg.data.pin_memory and device.type == "cuda",
        drop_last=True,
    )
    return sampler, loader


def train_steps(model, optimizer, sampler, loader, meter: common.Meter, dtype) -> None:
    """The documentation's loop: the meter's total steps, epoch after epoch, under autocast in
    `dtype` (None: no autocast)."""
    device, total = meter.device, meter.total
    model.train()
    meter.start()
    epoch = 0
    while meter.steps < total:
        sampler.set_epoch(epoch)
        for batch in loader:
            if meter.steps == total:
                break
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast(
                device.type, dtype=dtype or torch.float32, enabled=dtype is not None
            ):
                loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            meter.step(loss)
        epoch += 1


if __name__ == "__main__":
    main()
