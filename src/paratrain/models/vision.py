"""Image classifiers: torchvision's MobileNetV2 and ResNet-50 (any input channels), a tiny CNN,
and VisionSpec, what parallel/ may know of them (models/spec.py).

Weights start random: nothing is downloaded (the machines this runs on may have no network).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from paratrain.errors import UserError
from paratrain.protocols import FamilyTraits


def build_mobilenet_v2(num_classes: int, in_channels: int = 3) -> nn.Module:
    import torchvision  # here, not at the top: its import costs every process 2 s of CPU

    model = torchvision.models.mobilenet_v2(weights=None, num_classes=num_classes)
    if in_channels != 3:
        # The stem is features[0][0] (3x3 conv, stride 2, 32 filters); swap only its input side.
        stem = model.features[0][0]
        model.features[0][0] = nn.Conv2d(
            in_channels, stem.out_channels, stem.kernel_size, stem.stride, stem.padding, bias=False
        )
    return model


def build_resnet50(num_classes: int, in_channels: int = 3) -> nn.Module:
    import torchvision

    model = torchvision.models.resnet50(weights=None, num_classes=num_classes)
    if in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


class TinyCNN(nn.Module):
    """Two conv blocks and a linear head, no BatchNorm and no dropout: its result does not depend
    on how a batch is split, so strategies and accumulation can be compared exactly in tests."""

    def __init__(self, num_classes: int, in_channels: int = 1, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
            nn.Sequential(nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
        )
        self.pool = nn.AdaptiveAvgPool2d(4)
        self.classifier = nn.Linear(2 * width * 16, num_classes)

    def forward(self, x):
        return self.classifier(self.pool(self.features(x)).flatten(1))


def build_tiny_cnn(num_classes: int, in_channels: int = 1) -> nn.Module:
    return TinyCNN(num_classes, in_channels)


# ----------------------------------------------------------------------------- the family's spec


def trunk_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks: children of `features` (MobileNetV2, our CNNs) or ResNet's stages."""
    trunk = getattr(model, "features", None)
    if isinstance(trunk, nn.Sequential):
        return list(trunk)
    stages = [getattr(model, f"layer{i}", None) for i in range(1, 5)]
    if all(isinstance(s, nn.Sequential) for s in stages):
        return stages
    raise UserError(
        "model.name: the model has no sequential trunk (activation checkpointing and fsdp work "
        "per block); give it a `features` nn.Sequential (torchvision's MobileNetV2 and "
        "paratrain's models have one)"
    )


def _head_forward(model: nn.Module) -> Callable:
    # torchvision's models exist only where torchvision was imported (it built them): the tiny
    # CNN's pipeline stages need not pay its import (~1.5 s of CPU in every rank)
    tv = sys.modules.get("torchvision")
    if tv is not None and isinstance(model, tv.models.MobileNetV2):
        return lambda m, x: m.classifier(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))
    if tv is not None and isinstance(model, tv.models.ResNet):
        return lambda m, x: m.fc(torch.flatten(m.avgpool(x), 1))
    if hasattr(model, "pool") and hasattr(model, "classifier"):  # paratrain's tiny CNN
        return lambda m, x: m.classifier(m.pool(x).flatten(1))
    raise UserError(
        "strategy: pipeline cuts MobileNetV2, ResNet-50 and the tiny CNN into stages (split "
        f"too); {type(model).__name__} is none of them"
    )


def _stem_forward(m, x):  # ResNet's layers before layer1
    return m.maxpool(m.relu(m.bn1(m.conv1(x))))


_STEM = ("conv1", "bn1", "relu", "maxpool")
_HEAD = ("pool", "avgpool", "classifier", "fc")


def blocks_of(model: nn.Module) -> list[tuple[str, int | None]]:
    """The model's forward as a chain of units: (attribute of the model, index in it or None)."""
    _head_forward(model)  # raises for a model it does not know
    chain: list[tuple[str, int | None]] = []
    if isinstance(getattr(model, "features", None), nn.Sequential):
        chain += [("features", i) for i in range(len(model.features))]
    else:  # ResNet
        chain.append(("_stem", None))
        for i in range(1, 5):
            chain += [(f"layer{i}", j) for j in range(len(getattr(model, f"layer{i}")))]
    chain.append(("_head", None))
    return chain


def make_stage(
    model: nn.Module,
    keep: range,
    stage: int,
    stages: int,
    channels_last: bool = False,
) -> nn.Module:
    """Turns `model` (in place) into the stage that runs units `keep` of the chain: the others
    become nn.Identity and forward runs this stage's units only. Parameter names stay the whole
    model's.

    Stages send whole (contiguous) tensors. A channels_last activation is not contiguous in
    NCHW order, but its NHWC permutation is: a stage hands that on, and the next stage permutes
    back to a channels_last NCHW view, so neither side copies."""
    chain = blocks_of(model)
    head_fn = types.MethodType(_head_forward(model), model)
    runs: list[Callable] = []
    for i, (attr, item) in enumerate(chain):
        owned = i in keep
        if attr == "_stem":
            if owned:
                runs.append(types.MethodType(_stem_forward, model))
            else:
                for name in ("conv1", "bn1"):
                    setattr(model, name, nn.Identity())
        elif attr == "_head":
            if owned:
                runs.append(head_fn)
            else:
                for name in _HEAD:
                    if isinstance(getattr(model, name, None), nn.Module):
                        setattr(model, name, nn.Identity())
        else:
            container = getattr(model, attr)
            if owned:
                runs.append(container[item])
            else:
                container[item] = nn.Identity()

    def forward(self, x):
        if channels_last and stage > 0:
            x = x.permute(0, 3, 1, 2)  # NHWC as sent -> an NCHW view in channels_last layout
        for run in runs:
            x = run(x)
        if channels_last and stage < stages - 1:
            x = x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
        return x

    model.forward = types.MethodType(forward, model)
    return model


class VisionSpec:
    """Image classifiers: blocks are the trunk's, the pipeline chain is stem / blocks / head."""

    family = "vision"
    traits = FamilyTraits(image_levers=True)
    flops_formula = None  # images count samples, not tokens

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        return trunk_blocks(model)

    def pipeline_units(self, model: nn.Module) -> int:
        return len(blocks_of(model))

    def make_stage(self, model, keep, stage, stages, **options):
        return make_stage(model, keep, stage, stages, channels_last=options.get("channels_last"))

    def make_stages(self, model, local, stages, **options):
        raise UserError(
            "pipeline.schedule: an image model holds one stage a rank; use gpipe or 1f1b"
        )

    def split_units(self, model: nn.Module) -> list[nn.Module]:
        units: list[nn.Module] = []
        for attr, item in blocks_of(model):
            if attr == "_stem":
                units += [getattr(model, n) for n in _STEM]
            elif attr == "_head":
                units += [m for n in _HEAD if isinstance(m := getattr(model, n, None), nn.Module)]
            else:
                units.append(getattr(model, attr)[item])
        return units

    def tp_plan(self, model: nn.Module, **options) -> dict:
        raise UserError(
            "parallel.tp: tensor parallelism splits language models' projections; image models "
            "train with ddp, fsdp, pipeline or split"
        )

    def flops_per_token(self, model: nn.Module, seq_len: int, lora: bool) -> float | None:
        return None
