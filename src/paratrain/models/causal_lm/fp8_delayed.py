"""Float8 with delayed scaling (model.fp8=delayed): each cast's scale comes from the largest
value seen over the last HISTORY steps, not from the tensor being cast.

torchao's tensorwise recipe scales each tensor by its own amax: one pass over the tensor to find
it, then another to scale and cast, for every activation in forward and every gradient in
backward, and its backward casts each weight a second time. With a scale known before the tensor
exists, the cast is a pointwise epilogue that torch.compile fuses into the kernel producing the
tensor (the RMSNorm, the SiLU-multiply, the gradient's producer); the amax, still recorded for
the next steps, is a reduction beside it. This is Transformer Engine's default recipe (delayed
scaling over an amax history); torchao dropped its version. The matmuls are torchao's (its
matmul_with_hp_or_float8_args takes tensors already in float8), and so are the casts' scale
formula and float8 tensors.

- Weights: cast once a step, from their own amax (as torchao does), and that float8 weight is
  what backward uses: torchao's backward reads the fp32 weight again for a second cast.
- Activations (forward) and gradients (backward): the history's max. The first step of a run
  (and of a resumed run: the history is not checkpointed) scales dynamically, exactly as
  torchao's tensorwise recipe, and fills the history.
- A gradient's amax leaves backward as the "gradient" of a sink tensor (autograd's way out of a
  backward, compiled or not); a hook on the sink moves it into the history.

Values above the history's max saturate at float8's largest (as Transformer Engine does); the
loss curve against tensorwise says whether that matters for a model.
"""

from __future__ import annotations

import torch
from torch import nn

HISTORY = 16  # steps whose amax the scale covers


def _scale(amax: torch.Tensor, dtype: torch.dtype, config) -> torch.Tensor:
    from torchao.float8.float8_utils import amax_to_scale

    return amax_to_scale(amax, dtype, config.round_scales_to_power_of_2)


def _amax(t: torch.Tensor) -> torch.Tensor:
    # per row first, then over the rows: a row reduction has the cast's own loop shape, so
    # inductor can compute both in one kernel (a whole-tensor reduction it splits otherwise)
    return t.detach().abs().amax(dim=-1).amax().to(torch.float32)


def _push(history: torch.Tensor, amax: torch.Tensor) -> None:
    """The newest amax first, the oldest dropped (in place: a buffer)."""
    history.copy_(torch.cat([amax.reshape(1), history[:-1]]))


class _GradToFloat8(torch.autograd.Function):
    """Forward: the tensor as it is. Backward: its gradient cast to float8 (e5m2) with the
    history's scale (the tensor's own on the first step); the gradient's amax goes out as the
    sink's gradient."""

    @staticmethod
    def forward(ctx, y, sink, history, calibrated, mm_config, config):
        ctx.save_for_backward(history)
        ctx.calibrated, ctx.mm_config, ctx.config = calibrated, mm_config, config
        return y

    @staticmethod
    def backward(ctx, grad):
        from torchao.float8.float8_training_tensor import (
            GemmInputRole,
            hp_tensor_and_scale_to_float8,
        )

        (history,) = ctx.saved_tensors
        c = ctx.config
        dtype = c.cast_config_grad_output.target_dtype
        amax = _amax(grad)
        scale = _scale(history.max() if ctx.calibrated else amax, dtype, c)
        g8 = hp_tensor_and_scale_to_float8(
            grad, scale, dtype, ctx.mm_config, GemmInputRole.GRAD_OUTPUT
        )
        return g8, amax, None, None, None, None


class DelayedFloat8Linear(nn.Linear):
    """A torchao Float8Linear (tensorwise recipe) whose activation and gradient casts take
    delayed scales. An nn.Linear sharing the original layer's Parameters: the state dict,
    checkpoints, optimizers and exports see the same weight."""

    def __init__(self, layer: nn.Linear):
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a second weight
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.weight, self.bias = layer.weight, layer.bias
        self.config, self.linear_mm_config = layer.config, layer.linear_mm_config
        device = layer.weight.device
        # not checkpointed (persistent=False): a resumed run calibrates again on its first step
        self.register_buffer("x_history", torch.zeros(HISTORY, device=device), persistent=False)
        self.register_buffer("g_history", torch.zeros(HISTORY, device=device), persistent=False)
        self.calibrated = False
        self._new_sink(device)

    def _new_sink(self, device) -> None:
        # a plain leaf (not a Parameter: no optimizer, checkpoint or DDP sees it)
        self._sink = torch.zeros((), device=device, requires_grad=True)
        self._sink.register_post_accumulate_grad_hook(self._took_grad_amax)

    def _took_grad_amax(self, sink: torch.Tensor) -> None:
        with torch.no_grad():
            _push(self.g_history, sink.grad)
        sink.grad = None
        self.calibrated = True  # both histories hold a step now: the next casts are delayed

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)  # the buffers and Parameters move; the sink is made again
        self._new_sink(self.weight.device)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torchao.float8.float8_linear import matmul_with_hp_or_float8_args
        from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
        from torchao.float8.float8_training_tensor import (
            GemmInputRole,
            hp_tensor_and_scale_to_float8,
        )

        c, mm = self.config, self.linear_mm_config
        # exactly Float8Linear's check: CUDA's autocast only (the output's dtype)
        if torch.is_autocast_enabled("cuda"):
            x = x.to(torch.get_autocast_dtype("cuda"))
        dtype = c.cast_config_input.target_dtype
        if self.calibrated:
            scale = _scale(self.x_history.max(), dtype, c)
            x8 = hp_tensor_and_scale_to_float8(x, scale, dtype, mm, GemmInputRole.INPUT)
        else:
            x8 = hp_tensor_to_float8_dynamic(
                x,
                dtype,
                mm,
                gemm_input_role=GemmInputRole.INPUT,
                round_scales_to_power_of_2=c.round_scales_to_power_of_2,
            )
        training = torch.is_grad_enabled() and self.weight.requires_grad
        if training:  # evaluation leaves the history as training made it
            with torch.no_grad():
                _push(self.x_history, _amax(x))
        w8 = hp_tensor_to_float8_dynamic(
            self.weight.t(),
            c.cast_config_weight.target_dtype,
            mm,
            gemm_input_role=GemmInputRole.WEIGHT,
            round_scales_to_power_of_2=c.round_scales_to_power_of_2,
        )
        out = matmul_with_hp_or_float8_args.apply(x8, w8, mm, c)
        if training:
            out = _GradToFloat8.apply(out, self._sink, self.g_history, self.calibrated, mm, c)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"float8 delayed scaling over {HISTORY} steps"
        )


def delay_fp8(model: nn.Module) -> nn.Module:
    """Swap every torchao Float8Linear whose weight trains for a DelayedFloat8Linear (frozen
    ones are fp8_frozen's: their weights are cast once, their activations as torchao does)."""
    from torchao.float8.float8_linear import Float8Linear

    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, Float8Linear) and child.weight.requires_grad
    ]
    for parent, name, child in swaps:
        setattr(parent, name, DelayedFloat8Linear(child))
    return model
