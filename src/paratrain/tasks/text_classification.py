"""Sequence classification with BERT: labelled text (python-docstrings, or the user's CSV /
JSONL as text-labels) as [CLS] text [SEP] rows, the [CLS] state's class; cross-entropy, held-out
loss and accuracy."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from paratrain.config.data import LABELLED_TEXT
from paratrain.data.loader import OnDevice, loader_workers, rank_loaders
from paratrain.data.text import encoder as enc
from paratrain.data.text.tokenizer import check_tokenizer
from paratrain.distributed import process_group as pg
from paratrain.errors import UserError
from paratrain.models.bert import BertSpec, bert_of
from paratrain.protocols import BuildContext, Layout, Task, Workload
from paratrain.tasks.masked_lm import BERT_UNREAD, bert_imports
from paratrain.tasks.masked_lm import check as _bert_check


def check(cfg, layout: Layout) -> None:
    """The BERT checks (tasks/masked_lm.py), and a file for text-labels."""
    _bert_check(cfg, layout)
    if cfg.data.source == "text-labels" and not cfg.data.path:
        raise ValueError("data.path: text-labels reads a CSV or JSONL file with text and label")


def preflight(cfg, layout: Layout, cuda: bool) -> None:
    if cfg.model.path is not None and not Path(cfg.model.path).is_dir():
        raise UserError(
            f"model.path: no such directory {cfg.model.path} (a Hugging Face checkpoint)"
        )
    check_tokenizer(cfg.model.path, cfg.model.tokenizer)  # before the workers load the weights
    if cfg.data.source == "text-labels":  # unreadable or unlabelled: one line, before launch
        enc.read_labelled(cfg.data.path)


def labelled(cfg) -> tuple[list[str], list[int], list[str]]:
    if cfg.data.source == "python-docstrings":
        return enc.stdlib_docstrings()
    return enc.read_labelled(cfg.data.path)


class TextClassification:
    """One rank's classifier: its model, its labelled rows as loaders, and what the trainer
    calls (loss, evaluate), built once by `build` (the tasks' one shape, as gan.py's Gan)."""

    def __init__(self, ctx: BuildContext):
        cfg, policy, device = ctx.cfg, ctx.policy, ctx.device
        d, m = cfg.data, cfg.model
        self.policy, self.device, self.non_blocking = policy, device, d.non_blocking
        tokenizer = enc.encoder_tokenizer(m.path, m.tokenizer)
        texts, labels, names = labelled(cfg)
        self.model = bert_of(m, policy, device, num_labels=len(names))
        ids = enc.encode(texts, tokenizer, d.max_length)
        train_at, val_at = enc.held_out_split(len(ids), d.val_fraction)
        if d.limit_samples is not None:
            train_at = train_at[: d.limit_samples]
        ctx.one_batch_each(len(train_at))

        def rows(at):
            return enc.Rows([ids[i] for i in at], [labels[i] for i in at])

        self.train, self.val, self.sampler = rank_loaders(
            rows(train_at),
            rows(val_at) if val_at else None,
            d,
            sampler=ctx.layout.sampler,
            rank=ctx.dp_rank,
            world=ctx.dp_size,
            seed=cfg.seed,
            loader_batch=ctx.loader_batch,
            even_val=ctx.even_val,  # under FSDP every forward is a collective
            collate_fn=enc.Collate(tokenizer.pad_token_id),
            num_workers=loader_workers(d.num_workers),
            pin_memory=d.pin_memory and device.type == "cuda",
        )
        counts = torch.bincount(torch.tensor(labels), minlength=len(names)).tolist()
        self.info = {
            "data_real": True,
            "random_init": m.init == "random",
            "num_classes": len(names),
            "classes": dict(zip(names, counts, strict=True)),
            "train_rows": len(train_at),
            "val_rows": len(val_at),
            "parameters": sum(p.numel() for p in self.model.parameters()),
        }
        self.rows = {"train": len(train_at), "val": len(val_at)}

    def on_device(self, loader):
        device, non_blocking = self.device, self.non_blocking
        return OnDevice(
            loader,
            lambda batch: {k: v.to(device, non_blocking=non_blocking) for k, v in batch.items()},
        )

    def loss(self, model, batch):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return F.cross_entropy(logits.float(), batch["tag"]), None

    @torch.no_grad()
    def evaluate(self, model, loader) -> dict[str, float]:
        """Held-out mean loss and accuracy, summed over ranks."""
        model.eval()
        sums = torch.zeros(3, device=self.device, dtype=torch.float64)
        for batch in loader:
            with self.policy.autocast():
                logits = model(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
                ).logits.float()
            sums[0] += F.cross_entropy(logits, batch["tag"], reduction="sum").double()
            sums[1] += (logits.argmax(-1) == batch["tag"]).sum()
            sums[2] += len(batch["tag"])
        loss_sum, correct, n = pg.all_reduce_sum(sums.tolist(), self.device)
        return {"val_loss": loss_sum / max(n, 1), "val_accuracy": correct / max(n, 1)}

    def workload(self) -> Workload:
        return Workload(
            model=self.model,
            spec=BertSpec(),
            train=self.on_device(self.train),
            val=self.on_device(self.val) if self.val is not None else None,
            sampler=self.sampler,
            loss=self.loss,
            evaluate=self.evaluate,
            compile_units=BertSpec().blocks(self.model),
            info=self.info,
            rows=self.rows,
        )


def build(ctx: BuildContext) -> Workload:
    return TextClassification(ctx).workload()


TASK = Task(
    name="text_classification",
    reads=LABELLED_TEXT,
    layouts=frozenset({"single", "ddp", "fsdp"}),
    check=check,
    preflight=preflight,
    build=build,
    model_keys="huggingface",
    describes="labelled text -> the [CLS] state's class, cross-entropy, held-out accuracy",
    unread=BERT_UNREAD,
    imports=bert_imports,
    family=BertSpec.traits,
)
