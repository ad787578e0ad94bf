"""model.* and lora.*: which model, built how (ModelConfig), and its LoRA adapters (LoraConfig)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

# paratrain's own image builders (models/__init__.py MODELS maps each to its function)
IMAGE_MODELS = ("mobilenet_v2", "resnet50", "tiny_cnn")

# Keys that mean something to one task only: a run's result.json leaves the other task's out.
IMAGE_ONLY = ("name", "kwargs", "depthwise_conv", "shift_add_min_side", "sync_batchnorm")
IMAGE_ONLY += ("batchnorm", "stem_conv", "strided_min_side")

LM_ONLY = ("path", "init", "shape", "layers", "attn_implementation", "loss_chunk_tokens")
LM_ONLY += ("kernels", "fp8", "fp8_lm_head", "tokenizer")

_USER = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*|timm:[\w.\-]+")


@dataclass(kw_only=True)
class ModelConfig:
    name: str = "mobilenet_v2"
    """Image model: mobilenet_v2, resnet50, tiny_cnn; timm:NAME (any timm model, random
    weights: pip install timm); or your own builder as module.path:function."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Image model: keyword arguments for the builder beside num_classes and in_channels
    (`--set model.kwargs.width=64` calls build(num_classes=.., in_channels=.., width=64))."""
    path: str | None = None
    """Language model: a Hugging Face checkpoint directory (any AutoModelForCausalLM)."""
    init: Literal["pretrained", "random"] = "pretrained"
    """Language model: load the weights at path, or build the architecture with random weights."""
    shape: (
        Literal["llama3-8b", "llama3.2-1b", "tiny", "gpt2", "tiny-gpt2", "bert-base", "tiny-bert"]
        | None
    ) = None
    """Language model with init=random and no path: a named shape (Llama: llama3-8b,
    llama3.2-1b, tiny; GPT-2: gpt2 (124M), tiny-gpt2; BERT: bert-base, tiny-bert)."""
    layers: int | None = None
    """Language model with init=random: this many decoder layers instead of the shape's (a
    shallow 8B for a quick try of its width, a deeper tiny model for pipeline stages)."""
    tokenizer: Literal["auto", "bytes"] = "auto"
    """Language model: auto: model.path's own tokenizer (tokenizer.json, tokenizer.model, ...),
    or without a path paratrain's byte tokenizer; bytes: the byte tokenizer whatever the folder
    holds (your own model without a tokenizer): every UTF-8 byte is one id (0-255), then
    <|begin_of_text|> <|end_of_text|> <|pad|> (256-258; BERT's tasks: [PAD] [CLS] [SEP] [MASK],
    256-259), built in code, nothing downloaded or trained. The model's vocabulary must hold
    those 259 (260) ids; export saves it beside the model."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2", "flex_attention"] = "sdpa"
    """Language model attention kernel (transformers' attn_implementation)."""
    loss_chunk_tokens: int = 0
    """Language model: lm_head + cross-entropy over this many trained tokens at a time, never the
    whole [tokens, vocab] logits (models/causal_lm/loss.py); 0 uses transformers' own loss."""
    sync_batchnorm: bool = False
    """Image model under DDP (ddp-*): its BatchNorm layers become torch.nn.SyncBatchNorm, whose
    statistics are those of the whole batch over every rank (so N ranks at batch b normalise as
    one process at N x b does). GPUs only: torch's SyncBatchNorm has no CPU kernels."""
    depthwise_conv: Literal["auto", "native", "shift-add", "triton"] = "auto"
    """auto: triton for MobileNetV2 on a GPU with Triton (measured there), else native. Image model: depthwise convolutions through PyTorch (cuDNN on GPUs), or, on inputs of at
    least shift_add_min_side pixels, as shifted multiply-adds that torch.compile fuses
    (models/depthwise.py; needs train.compile), or as paratrain's Triton kernels, one pass over
    each tensor forward and backward (models/depthwise_triton.py; GPUs; without one, PyTorch's
    convolution). cuDNN runs MobileNetV2's 250x250 depthwise layers with a slow generic kernel
    on H200."""
    shift_add_min_side: int = 200
    """With depthwise_conv=shift-add or triton: the smallest input side (pixels) that takes the
    swapped form; below it, cuDNN. On H200, shift-add wins at 250 px and loses at 125 px and
    below."""
    strided_min_side: int | None = None
    """With depthwise_conv=shift-add or triton: the smallest input side (pixels) that takes the
    swapped form for the layers of stride 2 or more; null: shift_add_min_side. On H200 (issue
    34, call 21) paratrain's Triton kernels beat cuDNN's at stride 2 at every size MobileNetV2
    has (144 channels at 125 px: 0.91 against 1.00 ms), but not at stride 1 below 200 px; set to 0
    beside Triton everywhere else, the whole MobileNetV2 step ran 1.01x (calls 27-28)."""
    stem_conv: Literal["auto", "native", "depthwise"] = "auto"
    """auto: depthwise beside auto's Triton depthwise layers on one-channel images, else native.
    Image model with depthwise_conv shift-add or triton: a convolution from one input channel
    (the stem on grayscale images: MobileNetV2's 1 -> 32 on MNIST) in that form too, from
    shift_add_min_side pixels up. Each output channel convolves the one input channel with its
    own weight, a depthwise convolution of the input broadcast over channels. On H200 at
    500x500, cuDNN ran this layer with a layout conversion and a generic kernel."""
    batchnorm: Literal["auto", "native", "triton"] = "auto"
    """auto: triton beside auto's Triton depthwise layers (MobileNetV2 on a GPU), else native.
    Image model: BatchNorm2d layers (and a ReLU / ReLU6 right after one) through PyTorch, or in
    training through paratrain's Triton kernels over channels_last tensors, the activation inside
    (models/batchnorm_triton.py; GPUs; without one, the same arithmetic in torch). Not with
    model.sync_batchnorm."""
    kernels: Literal["auto", "none", "liger", "liger-loss", "triton-loss"] = "auto"
    """auto: triton-loss for a causal language model's full training on a GPU with Triton (no
    float8, tensor or pipeline parallelism), else none. Language model on CUDA (pip install liger-kernel): liger swaps in Liger-Kernel's Triton
    kernels (RMSNorm, RoPE, SwiGLU) and its fused linear cross-entropy; liger-loss only the fused
    cross-entropy (with train.compile, which fuses the rest itself). triton-loss: paratrain's
    cross-entropy kernel over the whole logits, which writes the loss's gradient in forward
    (models/causal_lm/ce_triton.py; no liger-kernel needed). loss_chunk_tokens, when set,
    replaces these losses with paratrain's chunked one."""
    fp8: Literal["none", "tensorwise", "rowwise", "delayed"] = "none"
    """Language model: the frozen base's linear layers (not lm_head) multiply in float8 through
    torchao's Float8Linear, scaled per tensor or per row; adapters and the rest keep the autocast
    dtype. Pair with train.compile: eagerly, torchao's backward also computes the frozen weights'
    gradients (3 matmuls per layer instead of 2); compiled, they are dropped (tested). pip install
    torchao; needs a GPU of compute capability 8.9+ (H100, H200) or the CPU. delayed: tensorwise
    scales taken from each cast's amax over the last 16 steps instead of the tensor's own, so
    compile writes each cast and its amax in one kernel, and each weight is cast once a step
    (Transformer Engine's default recipe; models/causal_lm/fp8_delayed.py): the fastest on one
    H200 (docs/precision.md). Not with FSDP or pipeline stages; the histories are not
    checkpointed, so a resumed run's first step scales as tensorwise does."""
    fp8_lm_head: bool | Literal["auto"] = "auto"
    """Language model with model.fp8: lm_head multiplies in float8 too (the logits' matmul, about
    a fifth of the Llama-3.2-1B shape's FLOPs): the logits then carry float8's rounding. auto:
    on with model.fp8 (asking for float8 is the opt-in; measured 0.12-0.13% from the bf16 loss
    curves), unless the chunked or a fused loss or tensor parallelism is used; false keeps the
    logits in bf16, as torchao and torchtitan advise."""

    def __post_init__(self) -> None:
        if self.init == "random" and self.path is None and self.shape is None:
            raise ValueError(
                "shape: init=random needs a shape (llama3-8b, llama3.2-1b, tiny, gpt2, tiny-gpt2) "
                "or a path"
            )
        if self.fp8_lm_head is True and self.fp8 == "none":
            raise ValueError("fp8_lm_head: needs model.fp8 (tensorwise, rowwise or delayed)")
        if self.stem_conv == "depthwise" and self.depthwise_conv == "native":
            raise ValueError("stem_conv: depthwise needs model.depthwise_conv shift-add or triton")
        if self.strided_min_side is not None and self.strided_min_side < 0:
            raise ValueError(f"strided_min_side: must be >= 0, got {self.strided_min_side}")
        if self.shift_add_min_side < 0:
            raise ValueError(f"shift_add_min_side: must be >= 0, got {self.shift_add_min_side}")
        if self.loss_chunk_tokens < 0:
            raise ValueError(f"loss_chunk_tokens: must be >= 0, got {self.loss_chunk_tokens}")
        if self.layers is not None and (self.layers < 1 or self.init != "random"):
            raise ValueError(f"layers: needs init=random and a count >= 1, got {self.layers}")
        if self.name not in IMAGE_MODELS and not _USER.fullmatch(self.name):
            raise ValueError(
                f"name: got {self.name!r}; accepted: {', '.join(IMAGE_MODELS)}, timm:NAME, or "
                "module.path:builder"
            )


@dataclass(kw_only=True)
class LoraConfig:
    enabled: bool = True
    """Train low-rank adapters only (peft); false trains every weight."""
    r: int = 8
    """Rank of the adapters (the seed's 8)."""
    alpha: float = 16.0
    """Scale: the adapter's update is multiplied by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: list[str] = field(default_factory=list)
    """Layers that get adapters, as name suffixes (peft's matching); empty: the family's default
    (Llama: q_proj v_proj o_proj, of q k v o gate up down _proj; GPT-2: attn.c_attn attn.c_proj,
    of c_attn c_proj c_fc)."""
    save_merged: bool = False
    """Also save the base model with the adapters merged in (full size)."""
    fused: bool | Literal["auto"] = "auto"
    """The adapter's product added inside its base layer's matmul (cuBLAS's C operand), forward
    and backward, instead of peft's full-size adapter outputs and their sums: the same
    arithmetic with one rounding fewer (models/causal_lm/lora_matmul.py). Needs dropout 0 and
    plain bf16 / fp32 base layers (no model.fp8, no tensor parallelism). auto: on where it was
    measured (a Llama-family LoRA on a GPU with Triton, in one process or under DDP: 1.013x
    peft's layers at 2 x 2,048 on one H100, 1.017x at 8, 1-4 GiB less); false: peft's forward."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"r: must be >= 1, got {self.r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout: must be in [0, 1), got {self.dropout}")
        if self.fused is True and self.dropout:
            raise ValueError("fused: the fused adapter takes no dropout; set lora.dropout=0")
