"""A DCGAN (Radford et al. 2016) for 28x28 images: the generator and the discriminator the
`gan` task trains, and their spec.

Generator: z [N, latent, 1, 1] -> transposed convolutions 7 -> 14 -> 28 -> tanh, in [-1, 1].
Discriminator: 28 -> 14 -> 7 -> one logit per image (the loss is BCE with logits: safe under
autocast). BatchNorm as in the paper (`norm: batch`), or none: with BatchNorm each rank
normalises its own share of the batch, so a data-parallel run is not the same computation as
one process with the whole batch; `norm: none` is, which the tests use to compare them.
"""

from __future__ import annotations

from torch import nn

from paratrain.errors import UserError
from paratrain.protocols import FamilyTraits


def _norm(kind: str, channels: int) -> nn.Module:
    return nn.BatchNorm2d(channels) if kind == "batch" else nn.Identity()


def build_generator(latent: int, width: int, channels: int, norm: str) -> nn.Sequential:
    return nn.Sequential(
        nn.Sequential(
            nn.ConvTranspose2d(latent, 2 * width, 7, 1, 0, bias=norm != "batch"),
            _norm(norm, 2 * width),
            nn.ReLU(),
        ),
        nn.Sequential(
            nn.ConvTranspose2d(2 * width, width, 4, 2, 1, bias=norm != "batch"),
            _norm(norm, width),
            nn.ReLU(),
        ),
        nn.Sequential(nn.ConvTranspose2d(width, channels, 4, 2, 1), nn.Tanh()),
    )


def build_discriminator(width: int, channels: int, norm: str) -> nn.Sequential:
    return nn.Sequential(
        # the paper: no normalisation on the first layer
        nn.Sequential(nn.Conv2d(channels, width, 4, 2, 1), nn.LeakyReLU(0.2)),
        nn.Sequential(
            nn.Conv2d(width, 2 * width, 4, 2, 1, bias=norm != "batch"),
            _norm(norm, 2 * width),
            nn.LeakyReLU(0.2),
        ),
        nn.Sequential(nn.Conv2d(2 * width, 1, 7, 1, 0), nn.Flatten(0)),
    )


def init_weights(module: nn.Module) -> None:
    """DCGAN's initialisation: convolutions N(0, 0.02), BatchNorm scale N(1, 0.02), shift 0."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.zeros_(m.bias)


class GAN(nn.Module):
    """The two models as one container: what checkpoints hold (generator.*, discriminator.*)
    and what evaluation runs. Training calls each part through its own wrapper."""

    def __init__(self, latent: int, width: int, channels: int, norm: str):
        super().__init__()
        self.latent = latent
        self.generator = build_generator(latent, width, channels, norm)
        self.discriminator = build_discriminator(width, channels, norm)
        init_weights(self)


class GanSpec:
    """What parallel/ may know of a part: its blocks (FSDP's units, what activation
    checkpointing recomputes) are its top-level Sequential children."""

    family = "gan"
    traits = FamilyTraits(compiles=False)  # two models: compiled only when asked
    flops_formula = None

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        return [m for m in model.children() if any(True for _ in m.parameters())]

    def _refuse(self, *_, **__):
        raise UserError(
            "strategy: the gan task trains with single, ddp-* or fsdp (each model wrapped on "
            "its own); tensor, pipeline and split parallelism are for large models"
        )

    pipeline_units = make_stage = make_stages = split_units = tp_plan = _refuse

    def flops_per_token(self, model: nn.Module, seq_len: int, lora: bool) -> None:
        return None
