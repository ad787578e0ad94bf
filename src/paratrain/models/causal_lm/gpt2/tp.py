"""GPT-2's tensor-parallel plan (Megatron's split, as spec.py's for Llama) for what Llama's plan
cannot take as it is: transformers' Conv1D projections and the fused q/k/v.

Conv1D is y = x @ W + b with W stored [in, out] (the transpose of nn.Linear's), which torch's
ColwiseParallel / RowwiseParallel refuse; the two styles below split it the same way through
distribute_module: column-wise W by its dim 1 (and b), row-wise W by its dim 0 (b whole), with
the same input and output layouts as torch's styles.

c_attn computes [q | k | v] in one matmul (W [E, 3E]). Its weight is split by contiguous
columns, like any column-wise layer, so that checkpoints, LoRA adapters and exports keep
transformers' layout and reshard between strategies (DCP knows nothing of q, k and v). Rank r's
contiguous third is not its heads' q, k and v (for tp=2, rank 0 holds q and half of k), so the
output of c_attn is all-gathered (3E per token, the price of the fused layer: about 1.5 times
the bytes of an attention all-reduce) and each rank keeps the q, k and v columns of its own
heads; backward sums those slices' gradients back onto the contiguous shards (a
reduce-scatter). The attention then runs on E/tp wide q, k and v: its split_size follows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ParallelStyle,
    PrepareModuleOutput,
    SequenceParallel,
)

from paratrain.models.causal_lm.tp_styles import adapter_plan, block_io, ends_plan


def gpt2_tp_plan(base: nn.Module, *, sequence_parallel: bool, loss_parallel: bool) -> dict:
    """{path in the transformers GPT2LMHeadModel: ParallelStyle}. Under LoRA (peft's layer
    around a projection) the base layer and lora_B (column-wise) or lora_A (row-wise) are
    split as spec.py does for Llama; the q/k/v gather sits on the adapted layer's output."""
    sp = sequence_parallel
    between = Shard(1) if sp else Replicate()
    decoder = base.transformer
    plan = ends_plan(base, "transformer.wte", "transformer.ln_f", sp, loss_parallel)
    if sp:
        # whole activations from the embeddings -> this rank's sequence shard, at the dropout
        # before the first block (the block itself takes a version-dependent positional list)
        plan["transformer.drop"] = PrepareModuleOutput(
            output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=True
        )
    for i, block in enumerate(decoder.h):
        if isinstance(block, nn.Identity):  # a pipeline stage's cut
            continue
        p = f"transformer.h.{i}"
        attn, mlp = block.attn, block.mlp
        if sp:
            plan[f"{p}.ln_1"] = SequenceParallel()
            plan[f"{p}.ln_2"] = SequenceParallel()
            # whole (gathered) sequences into attention and the MLP; out, the sequence shard
            for part, n_out in (("attn", 2), ("mlp", 1)):  # attention: (output, weights)
                adapted = hasattr(getattr(block, part).c_proj, "base_layer")
                plan[f"{p}.{part}"] = block_io(None, adapted, True, n_out)
        qkv = _column(f"{p}.attn.c_attn", attn.c_attn)
        # the gather after c_attn: with c_attn's own style when it is a plain Conv1D, alone on
        # peft's wrapper (whose base layer and lora_B carry the split)
        qkv[f"{p}.attn.c_attn"] = QKVGather(attn, then=qkv.get(f"{p}.attn.c_attn"))
        plan.update(qkv)
        plan.update(_row(f"{p}.attn.c_proj", attn.c_proj, between))
        plan.update(_column(f"{p}.mlp.c_fc", mlp.c_fc))
        plan.update(_row(f"{p}.mlp.c_proj", mlp.c_proj, between))
    return plan


def _column(path: str, module: nn.Module) -> dict[str, Any]:
    if hasattr(module, "base_layer"):  # peft's LoRA layer: lora_B split like its base
        return {f"{path}.base_layer": Conv1DColwise(), **adapter_plan(path, module, "lora_B", None)}
    return {path: Conv1DColwise()}


def _row(path: str, module: nn.Module, output) -> dict[str, Any]:
    if hasattr(module, "base_layer"):
        # lora_A split like its base and reduced the same way, to whole activations: lora_B, a
        # plain (whole) layer, must see every position for its weight's gradient to be the same
        # on every rank (block_io hands the block's sequence shard on)
        adapters = adapter_plan(path, module, "lora_A", Replicate())
        return {f"{path}.base_layer": Conv1DRowwise(Replicate()), **adapters}
    return {path: Conv1DRowwise(output)}


class _Conv1DStyle(ParallelStyle):
    """A Conv1D's parameters distributed (weight by `weight`, bias by `bias`), its input brought
    from `given` to `wanted`, its output to `output`, handed on as a local tensor."""

    weight: Any
    bias: Any
    given: Any
    wanted: Any
    output: Any

    def _apply(self, module: nn.Module, mesh) -> nn.Module:
        def partition(name, mod, mesh):
            if mod is not module:
                return
            for pname, param in list(mod.named_parameters(recurse=False)):
                placement = self.weight if pname == "weight" else self.bias
                dist_param = nn.Parameter(
                    distribute_tensor(param, mesh, [placement]),
                    requires_grad=param.requires_grad,
                )
                mod.register_parameter(pname, dist_param)

        def inputs(mod, args, mesh):
            x = args[0]
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, mesh, (self.given,), run_check=False)
            if x.placements != (self.wanted,):
                x = x.redistribute(placements=(self.wanted,), async_op=True)
            return x

        def outputs(mod, out, mesh):
            if out.placements != (self.output,):
                out = out.redistribute(placements=(self.output,), async_op=True)
            return out.to_local()

        return distribute_module(module, mesh, partition, inputs, outputs)


class Conv1DColwise(_Conv1DStyle):
    """W [in, out] split by output columns (and b): whole input, output split by features."""

    def __init__(self):
        super().__init__()
        self.weight, self.bias = Shard(1), Shard(0)
        self.given = self.wanted = Replicate()
        self.output = Shard(-1)


class Conv1DRowwise(_Conv1DStyle):
    """W [in, out] split by input rows, b whole: input split by features, the partial products
    summed (all-reduce to `output` Replicate, or reduce-scatter to the sequence shard)."""

    def __init__(self, output):
        super().__init__()
        self.weight, self.bias = Shard(0), Replicate()
        self.given = self.wanted = Shard(-1)
        self.output = output


class QKVGather(ParallelStyle):
    """After c_attn (and its own style `then`, if any): the gathered [q | k | v] cut to this
    rank's heads, and the attention told that q, k and v are E/tp wide."""

    def __init__(self, attention: nn.Module, then: ParallelStyle | None = None):
        super().__init__()
        self.attention, self.then = attention, then

    def _apply(self, module: nn.Module, mesh) -> nn.Module:
        if self.then is not None:
            module = self.then._apply(module, mesh)
        rank = mesh.get_local_rank()
        width = self.attention.embed_dim // mesh.size()
        self.attention.split_size = width
        cut = slice(rank * width, (rank + 1) * width)

        def own_heads(mod, args, out):
            whole = (
                DTensor.from_local(out, mesh, (Shard(-1),), run_check=False)
                .redistribute(placements=(Replicate(),))
                # each rank's gradient covers only its heads' columns: summed on the way back
                .to_local(grad_placements=(Partial(),))
            )
            q, k, v = whole.chunk(3, dim=-1)
            return torch.cat((q[..., cut], k[..., cut], v[..., cut]), dim=-1)

        module.register_forward_hook(own_heads)
        return module
