"""The GAN's scores (tasks/gan_score.py) against closed forms: the Fréchet distance of Gaussians,
and the Inception Score's formula at its two ends."""

import math

import torch
from torch import nn

from paratrain.tasks.gan_score import Scorer, frechet_distance, mean_cov


def test_frechet_distance_closed_forms():
    mu, cov = torch.zeros(3, dtype=torch.float64), torch.eye(3, dtype=torch.float64)
    assert abs(frechet_distance(mu, cov, mu, cov)) < 1e-9
    # shifted means only: the squared distance of the means
    assert math.isclose(frechet_distance(mu, cov, mu + 2, cov), 12.0, rel_tol=1e-9)
    # diagonal covariances: sum of (sqrt(a) - sqrt(b))^2
    a, b = torch.diag(torch.tensor([1.0, 4.0, 9.0])), torch.diag(torch.tensor([4.0, 4.0, 1.0]))
    want = (1 - 2) ** 2 + (2 - 2) ** 2 + (3 - 1) ** 2
    assert math.isclose(frechet_distance(mu, a.double(), mu, b.double()), want, rel_tol=1e-9)


def test_mean_cov_from_sums_matches_torch():
    x = torch.randn(50, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    mu, cov = mean_cov(x.sum(0), x.t() @ x, torch.tensor(50.0, dtype=torch.float64))
    torch.testing.assert_close(mu, x.mean(0))
    torch.testing.assert_close(cov, torch.cov(x.t()))


class Fixed(nn.Module):
    """A 'classifier' whose class is set by the input's first value; features = the input."""

    def __init__(self, classes: int):
        super().__init__()
        self.head = nn.Linear(classes, classes, bias=False)
        with torch.no_grad():
            self.head.weight.copy_(torch.eye(classes) * 50)

    def forward(self, x):
        return self.head(x)


def test_scores_same_images_and_the_two_ends_of_the_score():
    k = 4
    scorer = Scorer(Fixed(k), torch.device("cpu"))
    confident = torch.eye(k).repeat(8, 1)  # every class equally often, each one for sure
    scorer.add(confident, confident)
    out = scorer.result()
    assert abs(out["fid_classifier"]) < 1e-6  # the same images: no distance
    assert math.isclose(out["classifier_score"], k, rel_tol=1e-6)  # the score's maximum
    scorer = Scorer(Fixed(k), torch.device("cpu"))
    one_class = torch.eye(k)[:1].repeat(32, 1)  # every image the same class
    scorer.add(confident, one_class)
    out = scorer.result()
    assert math.isclose(out["classifier_score"], 1.0, rel_tol=1e-6)  # the minimum
    assert out["fid_classifier"] > 0.5
