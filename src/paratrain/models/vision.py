"""Image classifiers: torchvision's MobileNetV2 and ResNet-50 (any input channels), a tiny CNN.

Weights start random: nothing is downloaded (the machines this runs on may have no network).
"""

from __future__ import annotations

import torchvision
from torch import nn


def build_mobilenet_v2(num_classes: int, in_channels: int = 3) -> nn.Module:
    model = torchvision.models.mobilenet_v2(weights=None, num_classes=num_classes)
    if in_channels != 3:
        # The stem is features[0][0] (3x3 conv, stride 2, 32 filters); swap only its input side.
        stem = model.features[0][0]
        model.features[0][0] = nn.Conv2d(
            in_channels, stem.out_channels, stem.kernel_size, stem.stride, stem.padding, bias=False
        )
    return model


def build_resnet50(num_classes: int, in_channels: int = 3) -> nn.Module:
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
