"""Frozen float8 base layers: LoRA's base weights cast to float8 once, not on every step.

torchao's Float8Linear casts its weight to float8 in every forward and again in every backward
(an amax reduction and a cast over each weight: for the 8B shape about 7e9 bf16 values read
several times a step), because it is built for weights that change. Under LoRA the base weights
never change, so their float8 forms are made once here, with torchao's own cast and the layer's
own torchao config (the same scales, the same float8 values, the same matmul settings: the
numerics of Float8Linear, bit for bit). The backward computes only the input's gradient (there
is no weight gradient to compute) and keeps no activation for it.

Each weight is held twice in float8, once per matmul layout (the forward wants W^T column-major,
the input gradient W column-major; torchao would copy it otherwise), beside the bf16 weight the
state dict still shows. Applied only where each rank holds whole weights and builds only what
it keeps (not under FSDP's or tensor parallelism's shards, nor pipeline stages, which are cut
from the whole model after it is built: tasks/causal_lm.py decides).
"""

from __future__ import annotations

import torch
from torch import nn

from paratrain.models.swap import swap_modules


def _cast(hp: torch.Tensor, cast_config, mm_config, role, axis: int, config):
    from torchao.float8.float8_scaling_utils import (
        get_maybe_axiswise_dim,
        hp_tensor_to_float8_dynamic,
    )

    return hp_tensor_to_float8_dynamic(
        hp,
        cast_config.target_dtype,
        mm_config,
        gemm_input_role=role,
        scaling_granularity=cast_config.scaling_granularity,
        axiswise_dim=get_maybe_axiswise_dim(axis, cast_config.scaling_granularity),
        round_scales_to_power_of_2=config.round_scales_to_power_of_2,
    )


def _weight(data, scale, axis, dtype, mm_config):
    """The float8 weight as torchao's tensor, made inside the step from plain tensors: a tensor
    subclass among a compiled graph's inputs costs host time on every call (its flattening in
    the runtime wrapper); plain ones do not."""
    from torchao.float8.float8_training_tensor import Float8TrainingTensor, GemmInputRole

    return Float8TrainingTensor(data, scale, dtype, mm_config, GemmInputRole.WEIGHT, axis)


class _FrozenFloat8MM(torch.autograd.Function):
    """y = x @ W^T with W already in float8; the backward returns only dL/dx."""

    @staticmethod
    def forward(ctx, x, out_data, out_scale, gin_data, gin_scale, meta):
        from torchao.float8.float8_training_tensor import GemmInputRole

        mm_config, config, dtype, out_axis, gin_axis = meta
        ctx.save_for_backward(gin_data, gin_scale)
        ctx.meta = meta
        # the axis of Float8Linear's input cast (per row of x for rowwise scaling)
        x8 = _cast(x, config.cast_config_input, mm_config, GemmInputRole.INPUT, -1, config)
        w = _weight(out_data, out_scale, out_axis, dtype, mm_config)
        flat = x8.reshape(-1, x8.shape[-1])
        return torch.mm(flat, w).reshape(*x.shape[:-1], w.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        from torchao.float8.float8_training_tensor import GemmInputRole

        gin_data, gin_scale = ctx.saved_tensors
        mm_config, c, dtype, _, gin_axis = ctx.meta
        flat = grad.reshape(-1, grad.shape[-1])
        g8 = _cast(flat, c.cast_config_grad_output, mm_config, GemmInputRole.GRAD_OUTPUT, -1, c)
        w = _weight(gin_data, gin_scale, gin_axis, dtype, mm_config)
        grad_in = torch.mm(g8, w.t())
        return grad_in.reshape(*grad.shape[:-1], grad_in.shape[-1]), None, None, None, None, None


class FrozenFloat8Linear(nn.Linear):
    """A torchao Float8Linear whose weight does not train, with that weight in float8 once.

    An nn.Linear (peft and the model's spec see a linear layer) that shares the original layer's
    Parameters, so the state dict, checkpoints and LoRA merges see the bf16 weight unchanged."""

    def __init__(self, layer: nn.Linear):
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a second weight
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.weight, self.bias = layer.weight, layer.bias
        self.config, self.linear_mm_config = layer.config, layer.linear_mm_config
        self.recast()
        # a load into the module (not a DCP resume: frozen weights are not checkpointed) would
        # leave stale float8 copies; make them again
        self.register_load_state_dict_post_hook(lambda module, _keys: module.recast())

    @torch.no_grad()
    def recast(self) -> None:
        from torchao.float8.float8_training_tensor import GemmInputRole

        c, mm, w = self.config, self.linear_mm_config, self.weight
        # Float8Linear's two weight casts: for the output (W^T, column-major as torch.mm's
        # second operand wants) and for the input's gradient (W^T row-major, whose transpose
        # is the column-major W the backward's matmul wants)
        w_out = _cast(w.t(), c.cast_config_weight, mm, GemmInputRole.WEIGHT, 0, c)
        w_gin = _cast(
            w.t().contiguous(), c.cast_config_weight_for_grad_input, mm, GemmInputRole.WEIGHT, -1, c
        )
        # plain tensors kept (see _weight); not buffers: module.to(dtype) would cast them
        self._out_data, self._out_scale = w_out._data, w_out._scale
        self._gin_data, self._gin_scale = w_gin._data, w_gin._scale
        self._meta = (mm, c, w.dtype, w_out._axiswise_dim, w_gin._axiswise_dim)
        # fixed addresses, as parameters have: CUDA graphs (compile mode reduce-overhead) then
        # read them where they lie instead of copying them into the graph's inputs each replay
        for t in (self._out_data, self._out_scale, self._gin_data, self._gin_scale):
            torch._dynamo.mark_static_address(t)

    def _apply(self, fn, recurse=True):
        # .to(device) / .cuda() move the Parameters (strategy split puts layers on other GPUs);
        # the float8 copies are plain attributes, so they are made again where the weight is now
        super()._apply(fn, recurse)
        self.recast()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # exactly Float8Linear's check: CUDA's autocast only (the output's dtype)
        if torch.is_autocast_enabled("cuda"):
            x = x.to(torch.get_autocast_dtype("cuda"))
        out = _FrozenFloat8MM.apply(
            x, self._out_data, self._out_scale, self._gin_data, self._gin_scale, self._meta
        )
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, float8 once"


def freeze_fp8(model: nn.Module, layer_class=None) -> nn.Module:
    """Swap every torchao Float8Linear whose weight does not train for a FrozenFloat8Linear
    (dynamic scaling, as model.fp8's recipes set it; any other torchao setting keeps its layer),
    or for `layer_class` (fp8_delayed's, under model.fp8=delayed)."""
    layer_class = layer_class or FrozenFloat8Linear
    from torchao.float8.float8_linear import Float8Linear

    swap_modules(
        model,
        lambda m: isinstance(m, Float8Linear) and not m.weight.requires_grad and _plain(m),
        layer_class,
    )
    return model


def _plain(layer: nn.Module) -> bool:
    """Dynamic scaling of input, weight and gradient, no float8 all-gather: what this file
    reproduces (torchao's other modes keep their own layer)."""
    from torchao.float8.config import ScalingType

    c = layer.config
    casts = (
        c.cast_config_input,
        c.cast_config_weight,
        c.cast_config_grad_output,
        c.cast_config_weight_for_grad_input,
    )
    dynamic = all(cast.scaling_type is ScalingType.DYNAMIC for cast in casts)
    return dynamic and not c.enable_fsdp_float8_all_gather
