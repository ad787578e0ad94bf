"""How good a GAN's images are, judged by a small MNIST classifier that paratrain trained itself
(`gan.classifier`: the folder of an image_classification run on the same data source at its
native size, e.g. `paratrain run recipes/cases/mnist_classifier_cpu.yaml`).

Two numbers, each computed on that classifier, not on Inception-v3 (so neither is comparable
with published FID / Inception Score figures; both compare runs of this task with each other):

- fid_classifier: the Fréchet distance (Heusel et al. 2017, FID's formula) between the
  classifier's penultimate features of held-out real digits and of as many generated ones:
  |mu_r - mu_g|^2 + tr(C_r + C_g - 2 (C_r C_g)^1/2). Lower is better; 0 for identical
  distributions.
- classifier_score: exp(E_x KL(p(y|x) || p(y))) over generated digits (the Inception Score's
  formula, Salimans et al. 2016): up to 10 for confident digits of all ten classes.

The sums behind both are added over ranks, so every rank's share of the held-out set counts.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from paratrain.errors import UserError


def classifier_folder(path: str) -> tuple[Path, Path]:
    """-> (the run folder's config.yaml, its newest good checkpoint); a one-line error if the
    folder is not an image_classification run's."""
    from paratrain.checkpoint import resolve_resume

    folder = Path(path)
    config = folder / "config.yaml"
    if not config.is_file():
        raise UserError(
            f"gan.classifier: {path} is not a paratrain run folder (no config.yaml); train one "
            "with `paratrain run recipes/cases/mnist_classifier_cpu.yaml --output-dir DIR`"
        )
    ckpt = resolve_resume(folder / "checkpoints")
    if ckpt is None:
        raise UserError(f"gan.classifier: {path} holds no checkpoint")
    return config, ckpt


def load_classifier(path: str, data_source: str, device: torch.device) -> nn.Module:
    from paratrain.checkpoint import read_checkpoint
    from paratrain.config import load_config
    from paratrain.models import build_model

    config_file, ckpt = classifier_folder(path)
    cfg = load_config(config_file)
    if cfg.task != "image_classification" or cfg.data.source != data_source:
        raise UserError(
            f"gan.classifier: {path} trained task {cfg.task} on {cfg.data.source}; the score "
            f"needs an image_classification run on {data_source}"
        )
    if cfg.data.image_size not in (None, 28):
        raise UserError(
            f"gan.classifier: {path} saw {cfg.data.image_size}-pixel images; the generator "
            "draws 28x28: train the classifier with data.image_size unset"
        )
    model = build_model(cfg.model, 10, 1)
    model.load_state_dict(read_checkpoint(ckpt)["model"])
    return model.to(device).eval()


class Scorer:
    """Sums over one evaluation (this rank's share), then the two numbers over all ranks."""

    def __init__(self, classifier: nn.Module, device: torch.device):
        self.classifier, self.device = classifier, device
        heads = [m for m in classifier.modules() if isinstance(m, nn.Linear)]
        if not heads:
            raise UserError(
                "gan.classifier: the classifier has no linear head to take features from"
            )
        self._features: torch.Tensor | None = None
        # the penultimate features: what the last linear layer receives
        heads[-1].register_forward_pre_hook(lambda _m, args: self._keep(args[0]))
        self.sums: dict[str, torch.Tensor] = {}

    def _keep(self, x: torch.Tensor) -> None:
        self._features = x.detach().flatten(1).double()

    def _add(self, key: str, value: torch.Tensor) -> None:
        self.sums[key] = self.sums[key] + value if key in self.sums else value

    @torch.no_grad()
    def add(self, real: torch.Tensor, fake: torch.Tensor) -> None:
        """real, fake: images as the classifier takes them (normalised like its data)."""
        for kind, images in (("real", real), ("fake", fake)):
            logits = self.classifier(images).double()
            f = self._features
            self._add(
                f"{kind}_n", torch.tensor(float(len(f)), dtype=torch.float64, device=f.device)
            )
            self._add(f"{kind}_sum", f.sum(0))
            self._add(f"{kind}_outer", f.t() @ f)
            if kind == "fake":
                p = logits.softmax(1)
                self._add("p_sum", p.sum(0))
                self._add("plogp", (p * p.clamp_min(1e-12).log()).sum())

    def result(self) -> dict[str, float]:
        if not self.sums:
            return {}
        keys = sorted(self.sums)
        flat = torch.cat([self.sums[k].reshape(-1) for k in keys]).to(self.device)
        if dist.is_initialized():
            dist.all_reduce(flat)
        flat, out = flat.cpu(), {}
        offset = 0
        for k in keys:
            size = self.sums[k].numel()
            out[k] = flat[offset : offset + size].reshape(self.sums[k].shape)
            offset += size
        stats = [
            mean_cov(out[f"{k}_sum"], out[f"{k}_outer"], out[f"{k}_n"]) for k in ("real", "fake")
        ]
        n = out["fake_n"]
        p_mean = out["p_sum"] / n
        kl = out["plogp"] / n - (p_mean * p_mean.clamp_min(1e-12).log()).sum()
        return {
            "fid_classifier": frechet_distance(*stats[0], *stats[1]),
            "classifier_score": float(torch.exp(kl)),
        }


def mean_cov(total: torch.Tensor, outer: torch.Tensor, n: torch.Tensor):
    """Mean and (unbiased) covariance from the sum and the sum of outer products."""
    mu = total / n
    cov = (outer - n * torch.outer(mu, mu)) / (n - 1).clamp_min(1)
    return mu, cov


def _sqrt_psd(m: torch.Tensor) -> torch.Tensor:
    values, vectors = torch.linalg.eigh((m + m.t()) / 2)
    return vectors @ torch.diag(values.clamp_min(0).sqrt()) @ vectors.t()


def frechet_distance(mu1, cov1, mu2, cov2) -> float:
    """|mu1 - mu2|^2 + tr(C1 + C2 - 2 (C1 C2)^1/2), with tr (C1 C2)^1/2 taken as the trace of
    (C1^1/2 C2 C1^1/2)^1/2 (the same eigenvalues, and a symmetric matrix: eigh is stable)."""
    s1 = _sqrt_psd(cov1)
    cross = torch.linalg.eigvalsh(s1 @ cov2 @ s1).clamp_min(0).sqrt().sum()
    return float((mu1 - mu2).pow(2).sum() + cov1.trace() + cov2.trace() - 2 * cross)
