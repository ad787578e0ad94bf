"""Cross-entropy for causal LMs with large vocabularies, without the whole logits tensor.

transformers computes logits for every position ([tokens, vocab]: 4,096 x 128,256 in bf16 is
1 GB, and its loss upcasts them to fp32, 2 GB more) and keeps them for backward. Here the decoder
runs as usual, then lm_head + cross-entropy run over `chunk` trained positions at a time under
activation checkpointing: only one chunk's logits exist at once, in forward and in backward, and
positions whose label is -100 (the prompt, padding) never reach lm_head at all.

With model.kernels=liger the same wrapper calls Liger-Kernel's fused linear cross-entropy instead
(a Triton kernel that computes each chunk's logits, loss and gradients in one pass, on CUDA).

Under tensor parallelism the wrapper computes lm_head and the loss itself from whole logits
(chunk 0, no fused kernel): the logits are split over the vocabulary (a DTensor) and torch's loss_parallel computes the
cross-entropy on the shards; the training step runs forward and backward inside that context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from paratrain.models.causal_lm.family import decoder_of

IGNORE = -100


def _is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _base(model: nn.Module) -> nn.Module:
    """The model that holds lm_head: a peft model's base, else the model."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def plain_head(model: nn.Module) -> bool:
    """_plain_head of a model, a peft model too (whose base holds lm_head)."""
    return _plain_head(_base(model))


def _plain_head(base: nn.Module) -> bool:
    """lm_head is logits = hidden @ weight.T and nothing else: a bias-free nn.Linear (not peft's
    LoRA layer, not a tensor-parallel DTensor) and no logit scaling or soft-capping in the
    model's config (Gemma, Granite, Cohere): then WholeLoss computes what the model would."""
    head = base.lm_head
    # FSDP2 subclasses nn.Linear keeping its forward; torchao's float8 layers replace it
    return isinstance(head, nn.Linear) and type(head).forward is nn.Linear.forward and _bare(base)


def float8_head(model: nn.Module) -> bool:
    """lm_head is a float8 linear layer (model.fp8_lm_head: torchao's Float8Linear, or
    fp8_frozen's under LoRA) and nothing else: WholeLoss then calls the layer itself."""
    return _float8_head(_base(model))


def _float8_head(base: nn.Module) -> bool:
    head = base.lm_head
    return hasattr(head, "linear_mm_config") and _bare(base)


def _bare(base: nn.Module) -> bool:
    """lm_head without a bias, not a DTensor, and no logit scaling or soft-capping."""
    head, config = base.lm_head, base.config
    return (
        isinstance(head, nn.Linear)  # peft's LoRA layer is not one
        and head.bias is None
        and not _is_dtensor(head.weight)
        and not getattr(config, "final_logit_softcapping", None)
        and getattr(config, "logit_scale", None) in (None, 1, 1.0)
        and getattr(config, "logits_scaling", None) in (None, 1, 1.0)
    )


def _chunk_loss_sum(
    hidden: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    logits = hidden @ weight.t()
    return F.cross_entropy(logits.float(), labels, reduction="sum")


class WholeLoss(nn.Module):
    """lm_head + mean next-token loss over the whole logits, as a module (without parameters)
    so that train.compile compiles it in place: eagerly, the logits are upcast to fp32 (a copy
    of [tokens, vocab]), log-softmaxed (another) and gathered, and backward walks the same
    tensors again; compiled, the upcast, log-sum-exp and gather fuse into one pass over the bf16
    logits (8 ms of a 137 ms step for the Llama-3.2-1B shape at 4 x 2,048 on one H200)."""

    def forward(self, hidden, labels, weight, head=None):
        # head (weight None): a float8 lm_head layer (model.fp8_lm_head), called for its matmul
        logits = hidden @ weight.t() if head is None else head(hidden)
        return next_token_loss(logits, labels)


class ChunkLoss(nn.Module):
    """One chunk's lm_head + summed cross-entropy. A module (without parameters) so that
    train.compile can compile it in place like a decoder layer: the fp32 upcast, log-softmax and
    gather then fuse instead of each reading the chunk's logits from memory."""

    recomputed_in_backward = True  # chunked_cross_entropy checkpoints it: no CUDA graphs

    def forward(self, hidden, labels, weight):
        return _chunk_loss_sum(hidden, labels, weight)


def chunked_cross_entropy(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    weight: torch.Tensor,
    chunk: int,
    loss_fn=_chunk_loss_sum,
) -> torch.Tensor:
    """Mean next-token loss: hidden [B, T, H], labels [B, T] (unshifted, as transformers takes them)."""
    h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    y = labels[:, 1:].reshape(-1)
    keep = y != IGNORE
    h, y = h[keep], y[keep]
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, len(y), chunk):
        total = total + checkpoint(
            loss_fn,
            h[start : start + chunk],
            y[start : start + chunk],
            weight,
            use_reentrant=False,
        )
    return total / max(len(y), 1)


def liger_cross_entropy(
    hidden: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """Mean next-token loss through Liger-Kernel's fused lm_head + cross-entropy (CUDA only)."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    y = labels[:, 1:].reshape(-1)
    return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE)(weight, h, y)


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits [B, T, V] against labels [B, T] shifted by one. The labels
    are shifted (padded at the end), not the logits, so logits split over the vocabulary (a
    DTensor under loss_parallel) are only flattened, never sliced."""
    shifted = F.pad(labels, (0, 1), value=IGNORE)[:, 1:]
    return F.cross_entropy(logits.flatten(0, 1).float(), shifted.flatten(), ignore_index=IGNORE)


def next_token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The summed next-token loss (a pipeline divides it by the whole batch's token count)."""
    shifted = F.pad(labels, (0, 1), value=IGNORE)[:, 1:]
    return F.cross_entropy(
        logits.flatten(0, 1).float(), shifted.flatten(), ignore_index=IGNORE, reduction="sum"
    )


class ChunkedLossLM(nn.Module):
    """Wraps a causal LM (a peft model too) so that its forward returns the loss computed here:
    chunked (chunk > 0), through Liger's fused kernel (fused = liger / liger-loss), or from whole
    logits (chunk = 0, fused = none; the tensor-parallel path).

    The wrapper, not the model, is what DDP or FSDP wraps: their hooks must see the whole forward.
    It has no parameters of its own; checkpoints and optimizers see the model inside
    (`state_dict_root`, read by parallel.ddp.unwrap), under the model's own names.
    """

    state_dict_root = "lm"

    def __init__(self, lm: nn.Module, chunk: int, fused: str = "none"):
        super().__init__()
        self.lm, self.chunk, self.fused = lm, chunk, fused
        self.chunk_loss = ChunkLoss()
        self.whole_loss = WholeLoss()  # chunk 0, fused none: lm_head + loss as one compile unit

    def get_base_model(self) -> nn.Module:
        return _base(self.lm)

    @property
    def config(self):
        return self.get_base_model().config

    def forward(self, input_ids, labels, attention_mask=None, position_ids=None):
        from transformers.modeling_outputs import CausalLMOutput

        base = self.get_base_model()
        hidden = decoder_of(base)(  # Llama's .model, GPT-2's .transformer (layout.py)
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state
        labels = labels.to(hidden.device)  # strategy=split: the last layers' GPU
        if self.fused == "triton-loss":  # the loss's gradient written in forward (ce_triton.py)
            from paratrain.models.causal_lm.ce_triton import triton_lm_loss

            loss = triton_lm_loss(hidden, labels, base.lm_head.weight)
        elif self.fused.startswith("liger"):
            loss = liger_cross_entropy(hidden, labels, base.lm_head.weight)
        elif not self.chunk and _plain_head(base):
            loss = self.whole_loss(hidden, labels, base.lm_head.weight)
        elif not self.chunk and _float8_head(base):
            loss = self.whole_loss(hidden, labels, None, base.lm_head)
        elif not self.chunk:  # tensor parallel: lm_head's DTensor output under loss_parallel
            loss = next_token_loss(base.lm_head(hidden), labels)
        else:
            loss = chunked_cross_entropy(
                hidden, labels, base.lm_head.weight, self.chunk, self.chunk_loss
            )
        return CausalLMOutput(loss=loss)
