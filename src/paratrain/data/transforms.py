"""Resize + normalise, one function for both places it can run (seed 000 upscales MNIST to
500x500): per image in the loader workers (resize_on=cpu, the seed's way) or per batch on the
GPU after the uint8 copy (resize_on=gpu: 1 byte per pixel crosses PCIe instead of 4, at 28x28
instead of 500x500, and the GPU does the interpolation)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset


def resize_normalize(
    x: torch.Tensor, size: int | None, mean, std, dtype=torch.float32
) -> torch.Tensor:
    """uint8 [N, C, H, W] -> float [N, C, size, size], (x/255 - mean) / std."""
    x = x.to(dtype).div_(255.0)
    if size is not None and tuple(x.shape[-2:]) != (size, size):
        # Antialiasing only matters when shrinking; upscaling MNIST takes the plain (faster) kernel.
        shrink = size < max(x.shape[-2:])
        x = F.interpolate(
            x, size=(size, size), mode="bilinear", align_corners=False, antialias=shrink
        )
    mean_t = torch.as_tensor(mean, dtype=dtype, device=x.device).view(1, -1, 1, 1)
    std_t = torch.as_tensor(std, dtype=dtype, device=x.device).view(1, -1, 1, 1)
    return x.sub_(mean_t).div_(std_t)


class Prepared(Dataset):
    """A source's uint8 images, resized and normalised in the worker (resize_on=cpu), or passed
    through as uint8 for the device to finish (resize_on=gpu)."""

    def __init__(self, source: Dataset, size: int | None, mean, std, on_cpu: bool):
        self.source, self.size, self.mean, self.std, self.on_cpu = source, size, mean, std, on_cpu

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int):
        image, label = self.source[i]
        if self.on_cpu:
            image = resize_normalize(image.unsqueeze(0), self.size, self.mean, self.std)[0]
        return image, label
