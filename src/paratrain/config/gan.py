"""gan.*: the GAN task's own settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class GanConfig:
    latent_dim: int = 100
    """Length of the generator's noise vector z (DCGAN's 100)."""
    width: int = 64
    """Channels of the first discriminator / last generator layer (the others double it)."""
    norm: Literal["batch", "none"] = "batch"
    """BatchNorm as in DCGAN, or none. BatchNorm normalises each rank's own share of the batch,
    so only `none` makes N ranks the same computation as one process with the N-fold batch."""
    classifier: str | None = None
    """The folder of a paratrain image_classification run on the same data (28x28): scores the
    generated digits after every epoch (fid_classifier, classifier_score); none: no score."""
    grid: int = 64
    """Samples in each epoch's picture (from the same fixed noise every time)."""

    def __post_init__(self) -> None:
        for key in ("latent_dim", "width", "grid"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}: must be >= 1, got {getattr(self, key)}")
