"""CausalLMSpec: what parallel/ may know of a Hugging Face causal LM, under peft's LoRA wrapper
or not. Blocks, split units and FLOPs follow the family's layout (family.py: Llama's model.layers,
GPT-2's transformer.h); the tensor-parallel plan below is written for the Llama layout
(model.embed_tokens, model.layers[i].self_attn.{q,k,v,o}_proj, .mlp.{gate,up,down}_proj,
model.norm, lm_head), GPT-2's (Conv1D, fused q/k/v) in its folder, gpt2/. Pipeline stages run the
family's own entry (Llama: embedding and rotary positions; GPT-2: token plus learned position
embeddings) before their decoder layers. A tied lm_head lives on the first and the last stage at
once: parallel/pipeline.py sums the two copies' gradients so that they stay one weight.

The tensor-parallel plan is Megatron-LM's (Shoeybi et al. 2019) as torch.distributed.tensor.parallel
writes it: q/k/v and gate/up split by output columns (each rank holds whole heads), o and down by
input rows, so attention and the MLP each need one reduction. With sequence parallelism
(Korthikanti et al. 2022) the norms and the residual stream between them are split along the
sequence, and that reduction becomes a reduce-scatter plus an all-gather at the next block.
The embedding is split over the vocabulary and returns whole (replicated) activations, so
transformers' own code between embedding and first layer (causal mask, rotary positions) sees
the full sequence; the first layer takes its sequence shard from them.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from paratrain.errors import UserError
from paratrain.models.causal_lm.build import decoder_layers
from paratrain.models.causal_lm.family import decoder_of, family_of, family_parts
from paratrain.models.causal_lm.tp_styles import adapter_plan, block_io, ends_plan  # noqa: F401
from paratrain.protocols import Attention, FamilyTraits, linear_matmuls

COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROWWISE = ("o_proj", "down_proj")


def base_model(model: nn.Module) -> nn.Module:
    """The transformers model under peft's wrapper and paratrain's loss wrapper."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def check_parallel(config: Any, *, tp: int, pp: int, per_rank: int = 1) -> None:
    """Shape checks on a transformers config (or SHAPES entry): heads and widths must split
    evenly over tp (the vocabulary need not: DTensor gives the last ranks a row fewer, so
    GPT-2's 50,257 splits; tested), layers over the pp stages (pp x per_rank under an interleaved schedule);
    one line naming the field, before anything launches. A GPT2Config answers the Llama names
    (num_attention_heads, num_hidden_layers) through its attribute_map."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    if tp > 1:
        for key in (
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
        ):
            value = get(key)
            if value is not None and value % tp:
                raise UserError(
                    f"parallel.tp: {tp} does not divide the model's {key} ({value}); "
                    f"use a tp that divides it"
                )
    if pp > 1:
        layers = get("num_hidden_layers") or 0
        stages = pp * per_rank
        if layers < stages:
            key, count = (
                ("parallel.pp", str(pp))
                if per_rank == 1
                else ("pipeline.stages_per_rank", f"{pp} x {per_rank} = {stages}")
            )
            raise UserError(
                f"{key}: {count} pipeline stages but the model has only {layers} decoder layers"
            )


def check_positions(config: Any, max_length: int) -> None:
    """GPT-2 learns one embedding per position (n_positions of them): a longer row is an
    index past its table, found only in the first step. Llama's rotary positions have no such
    end."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    limit = get("max_position_embeddings")  # GPT2Config's attribute_map: n_positions
    if family_of(config).learned_positions and limit and max_length > limit:
        raise UserError(
            f"data.max_length: {max_length} exceeds the model's {limit} positions (GPT-2 learns "
            f"one embedding per position); use data.max_length={limit} or less"
        )


FLOPS_FORMULA = (
    "full: 6N + 12*layers*hidden*seq_len; LoRA: 4N + 12*layers*hidden*seq_len + 6*adapters; "
    "N = matmul weights (all parameters but the embedding tables; a tied lm_head counted)"
)


class CausalLMSpec:
    family = "causal_lm"
    traits = FamilyTraits(fp8=True, decoder_levers=True)
    flops_formula = FLOPS_FORMULA

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        return decoder_layers(model)

    # ------------------------------------------------------------------ pipeline and split

    def pipeline_units(self, model: nn.Module) -> int:
        return len(decoder_layers(model))

    def make_stage(self, model, keep, stage, stages, **options):
        """This rank's decoder layers `keep` (the embedding on the first stage, norm and lm_head
        on the last): the others become nn.Identity and `model`'s forward runs this stage."""
        first, last = stage == 0, stage == stages - 1
        _cut(model, set(keep), first, last)
        run = _stage_forward(base_model(model), keep, first, last, options)
        model.forward = types.MethodType(lambda self, x: run(x), model)
        return model

    def make_stages(self, model, local, stages, **options):
        """Several stages on this rank (an interleaved schedule): `local` is [(stage index,
        its layers)]. `model` keeps the layers of all of them; each stage is a module of its
        own that holds (shares) its layers, so the pipeline runs them apart while checkpoints
        and the optimizer see `model` as one."""
        indices = [s for s, _ in local]
        first, last = 0 in indices, stages - 1 in indices
        _cut(model, {i for _, keep in local for i in keep}, first, last)
        base = base_model(model)
        return [_StageModule(base, keep, s == 0, s == stages - 1, options) for s, keep in local]

    def split_units(self, model: nn.Module) -> list[nn.Module]:
        base = base_model(model)
        if base.config.tie_word_embeddings:
            raise UserError(
                "strategy: split puts the embedding and lm_head on different GPUs, and this model "
                "ties them; use parallel.pp (a pipeline keeps the two copies in step), tp or fsdp"
            )
        family, decoder = family_of(base), decoder_of(base)
        entry = [getattr(decoder, name) for name in family.embeddings]
        layers = getattr(decoder, family.layers)
        return [*entry, *layers, getattr(decoder, family.norm), base.lm_head]

    # ------------------------------------------------------------------ tensor parallel

    def tp_plan(
        self,
        model: nn.Module,
        *,
        sequence_parallel: bool = True,
        loss_parallel: bool = True,
        local_inputs: bool = False,
    ) -> dict[str, Any]:
        """{module path in `model`: ParallelStyle}. Modules a pipeline stage replaced by
        nn.Identity are left out.

        local_inputs: attention and the MLP get plain (replicated) tensors rather than DTensors.
        LoRA needs it: peft's adapter layers are plain nn.Linear beside the split base layer.
        For an adapter on a column-split layer, lora_B is split by columns like its base (lora_A
        stays whole: its output gradient arrives summed over the ranks); on a row-split layer,
        lora_A is split by rows (its output is reduced like the base's) and lora_B stays whole.
        """
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            PrepareModuleInput,
            SequenceParallel,
        )

        base = base_model(model)
        family = family_of(base)
        if family.parts:  # a family with its own plan (GPT-2: Conv1D, fused q/k/v)
            plan = family_parts(family).tp_plan(
                base, sequence_parallel=sequence_parallel, loss_parallel=loss_parallel
            )
            return _prefixed(model, base, plan)
        inner = base.model
        sp = sequence_parallel
        between = Shard(1) if sp else Replicate()  # the residual stream's layout between blocks
        plan = ends_plan(base, "model.embed_tokens", "model.norm", sp, loss_parallel)
        for i, layer in enumerate(inner.layers):
            if isinstance(layer, nn.Identity):
                continue
            p = f"model.layers.{i}"
            if sp and i == 0:  # whole activations from the embedding -> this rank's sequence shard
                plan[p] = PrepareModuleInput(
                    input_layouts=(Replicate(),),
                    desired_input_layouts=(Shard(1),),
                    use_local_output=True,
                )
            if sp:
                plan[f"{p}.input_layernorm"] = SequenceParallel()
                plan[f"{p}.post_attention_layernorm"] = SequenceParallel()
            for parent, takes in (("self_attn", "hidden_states"), ("mlp", None)):
                block = layer.get_submodule(parent)
                # An adapter on the row-split layer needs whole activations (see _rowwise): the
                # layer all-reduces, and the block hands on its own sequence shard of them.
                adapted = any(
                    n in ROWWISE and hasattr(m, "base_layer") for n, m in block.named_children()
                )
                out = Replicate() if adapted else between
                if sp:
                    # attention returns (output, attention weights or None)
                    n_out = 2 if parent == "self_attn" else 1
                    plan[f"{p}.{parent}"] = block_io(takes, adapted, local_inputs, n_out)
                for name, module in block.named_children():
                    path = f"{p}.{parent}.{name}"
                    if name in COLWISE:
                        plan.update(_colwise(path, module))
                    elif name in ROWWISE:
                        plan.update(_rowwise(path, module, out))
        return _prefixed(model, base, plan)

    def flops_per_token(self, model: nn.Module, seq_len: int, lora: bool) -> float:
        """Training FLOPs per token (FLOPS_FORMULA).

        Full training: 6N (2N forward, 4N backward: gradients for activations and for weights;
        PaLM, Chowdhery et al. 2022, App. B) plus attention 12 * layers * hidden * seq_len.
        LoRA: the frozen weights need no weight gradients, so 4N (2N forward, 2N for activation
        gradients) plus the same attention term (its score/value products have no weights and
        run forward and backward whatever is trained), plus 6 x the adapters' own parameters.
        N counts the weights of the base model's matmuls: every parameter but the embedding
        tables (lookups, not matmuls: the tokens', and GPT-2's learned positions), and the
        lm_head's vocabulary x hidden matmul also when it shares the token embedding's weight
        (tied, as Llama-3.2-1B's and GPT-2's): one tensor, two uses.
        """
        inner = base_model(model)
        cfg = inner.config
        decoder = decoder_of(inner)
        tables = sum(getattr(decoder, e).weight.numel() for e in family_of(inner).embeddings)
        base = sum(p.numel() for n, p in inner.named_parameters() if "lora_" not in n) - tables
        if getattr(cfg, "tie_word_embeddings", False):
            base += cfg.vocab_size * cfg.hidden_size  # the lm_head matmul, its weight listed once
        attention = 12 * cfg.num_hidden_layers * cfg.hidden_size * seq_len
        if not lora:
            return 6 * base + attention
        adapters = sum(p.numel() for n, p in inner.named_parameters() if "lora_" in n)
        return 4 * base + attention + 6 * adapters

    def step_work(self, model: nn.Module, batch: int, seq_len: int) -> tuple | None:
        """The matmuls and attention one training step must do (Workload.floor): every
        nn.Linear of the model at batch x seq_len tokens (forward, the input's gradient, the
        weight's where it trains; peft's adapters left out: rank-r, a rounding error), and each
        layer's causal attention. None for a family whose layers are not nn.Linear (GPT-2's
        Conv1D)."""
        inner = base_model(model)
        cfg = inner.config
        if not family_of(inner).analytic:
            return None
        tokens, work = batch * seq_len, []
        for name, m in inner.named_modules():
            if isinstance(m, nn.Linear) and "lora_" not in name:
                out_f, in_f = m.weight.shape
                work += linear_matmuls(tokens, in_f, out_f, weight_grad=m.weight.requires_grad)
        heads = cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        work.append(Attention(batch, heads, kv, seq_len, head_dim, cfg.num_hidden_layers))
        return tuple(work)


def _prefixed(model: nn.Module, base: nn.Module, plan: dict) -> dict:
    """The plan's paths are the transformers model's; peft's and the loss wrapper's sit above."""
    prefix = next(name for name, m in model.named_modules() if m is base)
    return {f"{prefix}.{k}" if prefix else k: v for k, v in plan.items()}


def _cut(model: nn.Module, keep: set[int], first: bool, last: bool) -> None:
    """Layers outside `keep` become nn.Identity; the embeddings stay only with the first stage,
    the final norm and lm_head with the last. Parameter names stay the whole model's."""
    base = base_model(model)
    family, decoder = family_of(base), decoder_of(base)
    layers = getattr(decoder, family.layers)
    for i in range(len(layers)):
        if i not in keep:
            layers[i] = nn.Identity()
    if not first:
        for name in family.embeddings:
            setattr(decoder, name, nn.Identity())
    if not last:
        setattr(decoder, family.norm, nn.Identity())
        base.lm_head = nn.Identity()


def _stage_forward(base: nn.Module, keep, first: bool, last: bool, options: dict):
    """forward(input ids or hidden states) -> hidden states, or logits on the last stage. No
    attention mask crosses the stages: rows are right-padded, so causal attention (sdpa's
    is_causal) never lets a real token see a pad, and pads carry no loss."""
    family, decoder = family_of(base), decoder_of(base)
    layers = [getattr(decoder, family.layers)[i] for i in keep]
    # With sequence parallelism each rank holds 1/tp of the sequence between layers.
    shards = options.get("sequence_shards", 1)

    def llama(x):  # Llama's layout: rotary positions computed on each stage
        h = decoder.embed_tokens(x) if first else x
        length = x.shape[1] if first else h.shape[1] * shards
        positions = torch.arange(length, device=h.device).unsqueeze(0)
        rope = decoder.rotary_emb(h, positions)
        for layer in layers:
            out = layer(h, attention_mask=None, position_ids=positions, position_embeddings=rope)
            h = out[0] if isinstance(out, tuple) else out  # older transformers: a tuple
        return h

    parts = family_parts(family)
    body = parts.stage_body(decoder, layers, first, options) if parts else llama

    def run(x):
        h = body(x)
        return base.lm_head(getattr(decoder, family.norm)(h)) if last else h

    return run


class _StageModule(nn.Module):
    """One of several stages on a rank: its layers registered here too (PipelineStage and FSDP
    take a module's parameters), run by the same forward as a single stage."""

    def __init__(self, base: nn.Module, keep, first: bool, last: bool, options: dict):
        super().__init__()
        family, decoder = family_of(base), decoder_of(base)
        layers = getattr(decoder, family.layers)
        self.layers = nn.ModuleList(layers[i] for i in keep)
        if first:
            for name in family.embeddings:
                setattr(self, name, getattr(decoder, name))
        if last:
            self.norm, self.lm_head = getattr(decoder, family.norm), base.lm_head
        self._run = _stage_forward(base, keep, first, last, options)

    def forward(self, x):
        return self._run(x)


def _colwise(path: str, module: nn.Module) -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel

    if hasattr(module, "base_layer"):  # peft's LoRA layer around the projection
        return {
            f"{path}.base_layer": ColwiseParallel(),
            **adapter_plan(path, module, "lora_B", None),
        }
    return {path: ColwiseParallel()}


def _rowwise(path: str, module: nn.Module, output) -> dict[str, Any]:
    from torch.distributed.tensor.parallel import RowwiseParallel

    if hasattr(module, "base_layer"):
        # lora_A is split by rows like the base layer and its partial products are reduced the
        # same way, to whole activations (output is Replicate); lora_B, whole, works on them and
        # its weight's gradient is the same on every rank.
        plan = {f"{path}.base_layer": RowwiseParallel(output_layouts=output)}
        plan.update(adapter_plan(path, module, "lora_A", output))
        return plan
    return {path: RowwiseParallel(output_layouts=output)}
