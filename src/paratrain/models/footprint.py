"""What a model takes, counted without data: its parameters, and the bytes autograd keeps for
backward over one training step's forward. The model is built on the meta device (shapes and
dtypes, no storage; peft's adapters too), then its tensors become fake CPU tensors (torch's
FakeTensorMode) for the step, so that each op picks the kernel a CPU run picks (on the meta
device attention would take its math path, which saves the attention probabilities a CPU step
does not keep). A 500x500 MobileNetV2 or an 8B decoder is counted in a fraction of a second
without a byte allocated (the tasks' Task.footprint; the plan's memory line, runplan/cpu.py).

Saved tensors are counted as the pack hook of torch.autograd.graph.saved_tensors_hooks sees
them, by the storage each holds alive (a view keeps its whole base; two ops saving one tensor
count once), the parameters' storages left out (they are counted as weights). On MobileNetV2
at 64x64, the tiny Llama at 128 tokens and its LoRA this is what a real CPU step saves, to the
byte (6,634,036, 1,401,356 and 998,412 bytes a sample in fp32); under fp16 or bf16 autocast a
CPU step keeps more (7,857,460 for that MobileNetV2: the fp32 inputs and their half casts), so
the fp32 count is a lower bound there.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.autograd.graph import saved_tensors_hooks


def counted(
    build: Callable[[], nn.Module], step: Callable[[nn.Module], torch.Tensor], input_bytes: int
) -> dict[str, int]:
    """build() on the meta device, then step(model) -> its loss on one sample, on fake CPU
    tensors -> parameters, trainable, saved_per_sample, input_per_sample."""
    with torch.device("meta"):
        model = build()
    mode = FakeTensorMode()
    params = [p for _, p in faked(model, mode)]
    own = {p.untyped_storage()._cdata for p in params}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in own:
            saved[storage._cdata] = storage.nbytes()
        return t

    with mode, saved_tensors_hooks(pack, lambda t: t):
        step(model)
    return {
        "parameters": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
        "saved_per_sample": sum(saved.values()),
        "input_per_sample": input_bytes,
    }


def faked(model: nn.Module, mode: FakeTensorMode) -> list[tuple[str, nn.Parameter]]:
    """The meta model's parameters and buffers made fake CPU tensors of `mode`, in place ->
    its parameters. A tensor two modules share (a tied lm_head) stays one."""
    convert, cpu = mode.fake_tensor_converter.from_meta_and_device, torch.device("cpu")
    done: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and id(p) not in done:
                fake = convert(mode, p, cpu)
                done[id(p)] = nn.Parameter(fake, requires_grad=p.requires_grad)
            if p is not None:
                module._parameters[name] = done[id(p)]
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = done.setdefault(id(b), convert(mode, b, cpu))
    return list(model.named_parameters())
