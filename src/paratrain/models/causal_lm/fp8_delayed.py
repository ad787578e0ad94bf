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
  backward, compiled or not); a hook on the sink moves it into the history, and the input's
  amax, kept aside in forward, with it: every forward of a step reads the histories as the
  previous steps left them.
- Layers fed the same tensor (q/k/v, gate/up) read one history, their first layer's, which
  alone records the input's amax: the same scale on the same tensor is the same cast, which
  compile computes once (torchao's dynamic casts of one tensor are merged the same way; with
  a history each, they would be three).

Values above the history's max saturate at float8's largest (as Transformer Engine does); the
loss curve against tensorwise says whether that matters for a model. An overflowed step's amax
enters the history as 0, and a layer delays its casts only once its histories hold a positive
amax (an all-masked first batch has none). Under DDP each rank's
histories are its own (rank_local_buffers: DDP neither broadcasts nor averages them). With
gradient accumulation the history spans HISTORY backward passes, not optimizer steps.
"""

from __future__ import annotations

import torch
from torch import nn

from paratrain.models.causal_lm.fp8_frozen import FrozenFloat8Linear, _weight
from paratrain.models.swap import swap_modules

HISTORY = 16  # steps whose amax the scale covers


def _scale(amax: torch.Tensor, dtype: torch.dtype, config) -> torch.Tensor:
    from torchao.float8.float8_utils import amax_to_scale

    return amax_to_scale(amax, dtype, config.round_scales_to_power_of_2)


def _amax(t: torch.Tensor) -> torch.Tensor:
    # per row first, then over the rows: a row reduction has the cast's own loop shape, so
    # inductor can compute both in one kernel (a whole-tensor reduction it splits otherwise)
    return t.detach().abs().amax(dim=-1).amax().to(torch.float32)


def _push(history: torch.Tensor, amax: torch.Tensor) -> None:
    """The newest amax first, the oldest dropped (in place: a buffer). An inf or NaN amax (a
    step whose gradients overflowed) enters as 0, which no scale reads (the history's max
    does): kept, it would set every scale of the next 16 steps to nothing or NaN. Three small
    kernels, launched from a hook for every layer in every step: no more."""
    amax = torch.nan_to_num(amax.reshape(1).to(history.dtype), nan=0.0, posinf=0.0)
    history.copy_(torch.cat([amax, history[:-1]]))


def _grad_to_float8(grad, history, calibrated, mm_config, config):
    """A gradient cast to float8 (e5m2) with the history's scale (its own amax on the first
    step) -> (the float8 gradient, its amax for the history)."""
    from torchao.float8.float8_training_tensor import (
        GemmInputRole,
        hp_tensor_and_scale_to_float8,
    )

    dtype = config.cast_config_grad_output.target_dtype
    amax = _amax(grad)
    scale = _scale(history.max() if calibrated else amax, dtype, config)
    g8 = hp_tensor_and_scale_to_float8(grad, scale, dtype, mm_config, GemmInputRole.GRAD_OUTPUT)
    return g8, amax


class _DelayedMM(torch.autograd.Function):
    """y = x8 @ w8_t for a weight that trains, both already in float8. Backward casts the
    gradient itself (a gradient handed on as a float8 tensor by another Function would reach
    this one as a plain tensor under torch.compile) and returns its amax as the sink's
    gradient: dL/dx = g8 @ w8_t^T, dL/dW = (g8^T @ x8)^T, torchao's float8 matmuls."""

    @staticmethod
    def forward(ctx, x8, w8_t, sink, history, meta):
        ctx.save_for_backward(x8, w8_t, history)
        ctx.meta = meta
        flat = x8.reshape(-1, x8.shape[-1])
        return torch.mm(flat, w8_t).reshape(*x8.shape[:-1], w8_t.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        x8, w8_t, history = ctx.saved_tensors
        mm_config, config, calibrated = ctx.meta
        flat = grad.reshape(-1, grad.shape[-1])
        g8, amax = _grad_to_float8(flat, history, calibrated, mm_config, config)
        grad_in = torch.mm(g8, w8_t.t()).reshape(*grad.shape[:-1], w8_t.shape[0])
        grad_w = torch.mm(g8.t(), x8.reshape(-1, x8.shape[-1]))
        return grad_in, grad_w.t(), amax, None, None


class _DelayedCasts:
    """The amax histories, the gradient's sink and the casts, for a float8 linear layer."""

    # each rank's own: DDP neither broadcasts nor averages them (parallel/ddp.py)
    rank_local_buffers = ("x_history", "g_history", "x_amax")

    def _init_delayed(self, device) -> None:
        # not checkpointed (persistent=False): a resumed run calibrates again on its first step
        self.register_buffer("x_history", torch.zeros(HISTORY, device=device), persistent=False)
        self.register_buffer("g_history", torch.zeros(HISTORY, device=device), persistent=False)
        self.register_buffer("x_amax", torch.zeros((), device=device), persistent=False)
        self.calibrated = False
        self._x_from = (self,)  # the layer whose input history this one reads (share_inputs)
        self._new_sink(device)

    def _new_sink(self, device) -> None:
        # a plain leaf (not a Parameter: no optimizer, checkpoint or DDP sees it)
        self._sink = torch.zeros((), device=device, requires_grad=True)
        self._sink.register_post_accumulate_grad_hook(self._took_grad_amax)

    def _took_grad_amax(self, sink: torch.Tensor) -> None:
        own_input = self._x_from[0] is self
        with torch.no_grad():
            _push(self.g_history, sink.grad)
            if own_input:
                _push(self.x_history, self.x_amax)
        sink.grad = None
        if not self.calibrated:  # delayed casts once the histories hold a usable amax (a sync,
            # in the first steps only): an all-zero history would scale every value to nothing
            self.calibrated = bool(self.g_history.max() > 0) and (
                not own_input or bool(self.x_history.max() > 0)
            )

    def __setstate__(self, state):
        super().__setstate__(state)  # a deep copy's or unpickled sink has lost its hook
        self._new_sink(self.weight.device)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)  # the buffers and Parameters move; the sink is made again
        for name in self.rank_local_buffers:  # amaxes stay float32 under model.to(bfloat16)
            self._buffers[name] = self._buffers[name].float()
        self._new_sink(self.weight.device)
        return self

    def _input_in_float8(self, x: torch.Tensor, training: bool):
        from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
        from torchao.float8.float8_training_tensor import (
            GemmInputRole,
            hp_tensor_and_scale_to_float8,
        )

        c, mm = self.config, self.linear_mm_config
        dtype = c.cast_config_input.target_dtype
        source = self._x_from[0]
        if self.calibrated and source.calibrated:  # the source's history may still be empty
            scale = _scale(source.x_history.max(), dtype, c)
            x8 = hp_tensor_and_scale_to_float8(x, scale, dtype, mm, GemmInputRole.INPUT)
        else:
            x8 = hp_tensor_to_float8_dynamic(
                x,
                dtype,
                mm,
                gemm_input_role=GemmInputRole.INPUT,
                round_scales_to_power_of_2=c.round_scales_to_power_of_2,
            )
        if training and source is self:  # evaluation leaves the history as training made it
            with torch.no_grad():
                # into the history after backward (_took_grad_amax). A layer called twice in a
                # step records its last call's amax (and the sum of its gradients' amaxes):
                # no decoder paratrain trains reuses a layer
                self.x_amax.copy_(_amax(x))
        return x8

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"float8 delayed scaling over {HISTORY} steps"
        )


class DelayedFloat8Linear(_DelayedCasts, nn.Linear):
    """A torchao Float8Linear (tensorwise recipe) whose activation and gradient casts take
    delayed scales. An nn.Linear sharing the original layer's Parameters: the state dict,
    checkpoints, optimizers and exports see the same weight."""

    def __init__(self, layer: nn.Linear):
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a second weight
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.weight, self.bias = layer.weight, layer.bias
        self.config, self.linear_mm_config = layer.config, layer.linear_mm_config
        self._init_delayed(layer.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torchao.float8.float8_linear import matmul_with_hp_or_float8_args
        from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
        from torchao.float8.float8_training_tensor import GemmInputRole

        c, mm = self.config, self.linear_mm_config
        # exactly Float8Linear's check: CUDA's autocast only (the output's dtype)
        if torch.is_autocast_enabled("cuda"):
            x = x.to(torch.get_autocast_dtype("cuda"))
        training = torch.is_grad_enabled() and self.weight.requires_grad
        x8 = self._input_in_float8(x, training)
        w8 = hp_tensor_to_float8_dynamic(
            self.weight.t(),
            c.cast_config_weight.target_dtype,
            mm,
            gemm_input_role=GemmInputRole.WEIGHT,
            round_scales_to_power_of_2=c.round_scales_to_power_of_2,
        )
        if training:
            out = _DelayedMM.apply(x8, w8, self._sink, self.g_history, (mm, c, self.calibrated))
        else:
            out = matmul_with_hp_or_float8_args.apply(x8, w8, mm, c)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out


class _FrozenMM(torch.autograd.Function):
    """y = x8 @ W^T with x and the frozen W already in float8 (fp8_frozen's copies); backward
    casts the gradient itself with the history's scale, returns dL/dx and, as the sink's
    gradient, the gradient's amax."""

    @staticmethod
    def forward(ctx, x8, out_data, out_scale, gin_data, gin_scale, sink, history, meta):
        mm_config, _, dtype, out_axis, _ = meta[0]
        ctx.save_for_backward(gin_data, gin_scale, history)
        ctx.meta = meta
        w = _weight(out_data, out_scale, out_axis, dtype, mm_config)
        flat = x8.reshape(-1, x8.shape[-1])
        return torch.mm(flat, w).reshape(*x8.shape[:-1], w.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        gin_data, gin_scale, history = ctx.saved_tensors
        (mm_config, config, dtype, _, gin_axis), calibrated = ctx.meta
        flat = grad.reshape(-1, grad.shape[-1])
        g8, amax = _grad_to_float8(flat, history, calibrated, mm_config, config)
        w = _weight(gin_data, gin_scale, gin_axis, dtype, mm_config)
        grad_in = torch.mm(g8, w.t()).reshape(*grad.shape[:-1], w.shape[0])
        return grad_in, None, None, None, None, amax, None, None


class DelayedFrozenFloat8Linear(_DelayedCasts, FrozenFloat8Linear):
    """fp8_frozen's layer (the frozen weight in float8 once) with delayed activation and
    gradient casts."""

    def __init__(self, layer: nn.Linear):
        FrozenFloat8Linear.__init__(self, layer)
        self._init_delayed(layer.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled("cuda"):
            x = x.to(torch.get_autocast_dtype("cuda"))
        if not torch.is_grad_enabled():  # evaluation: fp8_frozen's own cast and matmul
            return FrozenFloat8Linear.forward(self, x)
        x8 = self._input_in_float8(x, training=True)
        out = _FrozenMM.apply(
            x8,
            self._out_data,
            self._out_scale,
            self._gin_data,
            self._gin_scale,
            self._sink,
            self.g_history,
            (self._meta, self.calibrated),
        )
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out


def delay_fp8(model: nn.Module) -> nn.Module:
    """Swap every torchao Float8Linear whose weight trains for a DelayedFloat8Linear (frozen
    ones are fp8_frozen's: their weights are cast once, their activations as torchao does)."""
    from torchao.float8.float8_linear import Float8Linear

    swap_modules(
        model, lambda m: isinstance(m, Float8Linear) and m.weight.requires_grad, DelayedFloat8Linear
    )
    return share_inputs(model)


# leaf names of linear layers that every Hugging Face decoder feeds the same tensor
_SAME_INPUT = ({"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"})


def share_inputs(model: nn.Module) -> nn.Module:
    """Point each delayed layer fed its sibling's input (q/k/v, gate/up; a LoRA wrapper's
    base_layer counts as the layer it wraps) at the first sibling's input history."""
    groups: dict[tuple[str, int], _DelayedCasts] = {}
    for path, module in model.named_modules():
        if not isinstance(module, _DelayedCasts):
            continue
        parent, _, leaf = path.removesuffix(".base_layer").rpartition(".")
        family = next((i for i, names in enumerate(_SAME_INPUT) if leaf in names), None)
        if family is None:
            continue
        first = groups.setdefault((parent, family), module)
        module._x_from = (first,)  # a tuple: not registered as a submodule
    return model
