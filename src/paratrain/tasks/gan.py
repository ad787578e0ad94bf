"""A GAN (seed 001 §6's case study): a DCGAN generator and discriminator on real MNIST digits,
each under its own data-parallel wrapper (DDP or FSDP2), each with its own optimizer, trained by
the usual alternating step:

1. the discriminator learns to say 1 for real images and 0 for generated ones (the generator's
   output detached: only the discriminator learns here);
2. the generator learns to make the updated discriminator say 1 for its images.

Metrics that mean something for a GAN: both losses, the discriminator's held-out accuracy, a
grid of samples from fixed noise in the run folder after every epoch (samples/epoch_<e>.png),
and with `gan.classifier` two scores on a small MNIST classifier paratrain trained
(tasks/gan_score.py: a Fréchet distance on its features and the Inception Score's formula).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from paratrain.config.data import IMAGE_SOURCES
from paratrain.config.keys import IMAGE_UNREAD
from paratrain.distributed import process_group as pg
from paratrain.meters.profiling import phase
from paratrain.models.gan import GAN, GanSpec
from paratrain.protocols import BuildContext, Layout, StepContext, Task, Workload
from paratrain.tasks.image_classification import build_images, image_loader
from paratrain.tasks.image_classification import preflight as image_preflight


def check(cfg, layout: Layout) -> None:
    if cfg.sync.mode != "every_step":
        raise ValueError(f"sync.mode: {cfg.sync.mode}: the gan task synchronises every step")
    if cfg.train.grad_accum_steps != 1:
        raise ValueError(
            "train.grad_accum_steps: the gan task's alternating step takes one batch per update"
        )
    if cfg.data.image_size not in (None, 28):
        raise ValueError(
            f"data.image_size: the DCGAN here draws 28x28 images, got {cfg.data.image_size}"
        )
    if cfg.ddp.gradient_compression != "none":
        raise ValueError("ddp.gradient_compression: not offered for the gan task")
    if cfg.train.max_grad_norm is not None:
        raise ValueError("train.max_grad_norm: the gan task's own step does not clip")


def preflight(cfg, layout: Layout, cuda: bool) -> None:
    image_preflight(cfg, layout, cuda)
    if cfg.gan.classifier:
        from paratrain.tasks.gan_score import classifier_folder

        classifier_folder(cfg.gan.classifier)


def _bce(logits: torch.Tensor, target: float) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(
        logits.float(), torch.full_like(logits.float(), target)
    )


def held_out_line(result: dict) -> str:
    """Two losses, and the score when a classifier is given (the summary line's end)."""
    last = result["epochs"][-1] if result["epochs"] else {}
    held = (
        f"held-out D loss {last['val_d_loss']:.4f}, G loss {last['val_g_loss']:.4f}"
        if "val_d_loss" in last
        else "no held-out set"
    )
    if "fid_classifier" in last:
        held += f", fid_classifier {last['fid_classifier']:.1f}"
    return held


def _no_single_loss(model, batch):
    raise AssertionError("the gan task trains through its own step (Workload.step)")


class Gan:
    """One rank's GAN: its models, its data's scale, its noise, and what the trainer calls
    (step, evaluate, finish), built once by `build`."""

    def __init__(self, ctx: BuildContext):
        cfg, policy, device, g = ctx.cfg, ctx.policy, ctx.device, ctx.cfg.gan
        self.cfg, self.policy, self.device, self.g = cfg, policy, device, g
        self.is_main, self.dp_rank, self.dp_size = ctx.is_main, ctx.dp_rank, ctx.dp_size
        self.data = build_images(ctx)
        src = self.data.source
        self.model = GAN(g.latent_dim, g.width, src.channels, g.norm).to(device, policy.param_dtype)
        self.mean = torch.as_tensor(src.mean, device=device).view(1, -1, 1, 1)
        self.std = torch.as_tensor(src.std, device=device).view(1, -1, 1, 1)
        self.scorer_model = None
        if g.classifier:
            from paratrain.tasks.gan_score import load_classifier

            self.scorer_model = load_classifier(g.classifier, cfg.data.source, device)
        fixed = torch.Generator(device=device).manual_seed(cfg.seed + 12345)
        self.grid_z = torch.randn(g.grid, g.latent_dim, 1, 1, generator=fixed, device=device)
        self.out_dir = ctx.out_dir  # the run folder: the sample grids go to its samples/
        self.last_grid: str | None = None  # the newest sample grid rank 0 wrote

    def to_gan(self, x: torch.Tensor) -> torch.Tensor:
        """The loader's normalised images -> [-1, 1], the generator's tanh range."""
        return ((x * self.std + self.mean) * 2 - 1).to(self.policy.param_dtype)

    def to_data(self, x: torch.Tensor) -> torch.Tensor:
        """Generated images -> normalised like the data (what the classifier takes)."""
        return ((x.float() + 1) / 2 - self.mean) / self.std

    def noise(self, seed: int, n: int) -> torch.Tensor:
        """This rank's rows of the whole batch's noise: the DistributedSampler's rank r takes
        samples r, r+W, ... so rows r, r+W, ... are its; N ranks then draw what one process
        with the N-fold batch draws."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        world, rank = self.dp_size, self.dp_rank
        z = torch.randn(n * world, self.g.latent_dim, 1, 1, generator=gen, device=self.device)
        return z[rank::world].to(self.policy.param_dtype)

    def loader(self, source, prefetch: bool):
        return image_loader(self.cfg, self.data, source, self.device, self.policy, prefetch)

    def step(self, run: StepContext, batch) -> tuple[torch.Tensor, None, bool]:
        """One alternating update; -> (discriminator + generator loss, no tokens, applied)."""
        G, D = run.parts["generator"], run.parts["discriminator"]
        opt_g, opt_d = run.optimizers
        scaler, cuda, policy = run.scaler, self.device.type == "cuda", self.policy
        real = self.to_gan(batch[0])
        n = len(real)
        z = self.noise(self.cfg.seed * 1_000_003 + run.step, n)
        # 1. the discriminator, on a batch of real and a batch of generated images (apart:
        # BatchNorm's statistics per kind, as in PyTorch's DCGAN example). Their gradients add
        # up locally and are all-reduced (DDP) or reduce-scattered (FSDP) once, after the second.
        with run.no_sync(D):
            with phase("forward", cuda), policy.autocast():
                loss_real = _bce(D(real), 1.0)
            with phase("backward", cuda):
                _backward(loss_real, scaler)
        with phase("forward", cuda), policy.autocast():
            fake = G(z)
            loss_fake = _bce(D(fake.detach()), 0.0)
        with phase("backward", cuda):
            _backward(loss_fake, scaler)
        loss_d = loss_real.detach() + loss_fake.detach()
        if not run.finite(loss_d):
            return _skip(loss_d, opt_d, opt_g)
        with phase("optimizer", cuda):
            _update(opt_d, scaler)
            opt_d.zero_grad(set_to_none=True)
        # 2. the generator, through the updated discriminator. The discriminator's own
        # gradients from this backward are dropped: under DDP their all-reduce is skipped
        # (no_sync). FSDP2 would keep unsynchronised gradients apart from .grad, where
        # zero_grad does not reach them, so there they are reduced and dropped.
        with run.discard(D):
            with phase("forward", cuda), policy.autocast():
                loss_g = _bce(D(fake), 1.0)
            with phase("backward", cuda):
                _backward(loss_g, scaler)
        opt_d.zero_grad(set_to_none=True)
        if not run.finite(loss_g):
            return _skip(loss_d + loss_g, opt_d, opt_g)
        with phase("optimizer", cuda):
            _update(opt_g, scaler)
            if scaler:
                scaler.update()
            opt_g.zero_grad(set_to_none=True)
        return (loss_d + loss_g).detach(), None, True

    @torch.no_grad()
    def evaluate(self, model, val) -> dict[str, float]:
        """Held-out: both losses and the discriminator's accuracy on real vs generated images,
        the classifier's scores, and the epoch's sample grid (rank 0 writes it)."""
        from paratrain.tasks.gan_score import Scorer

        model.eval()
        policy = self.policy
        scorer = Scorer(self.scorer_model, self.device) if self.scorer_model is not None else None
        sums = [0.0, 0.0, 0.0, 0.0]  # d loss x n, g loss x n, correct, n
        for i, (x, _) in enumerate(val):
            real = self.to_gan(x)
            n = len(real)
            z = self.noise(self.cfg.seed * 7_919 + i, n)
            with policy.autocast():
                fake = model.generator(z)
                logits = model.discriminator(torch.cat([real, fake])).float()
            d = _bce(logits[:n], 1.0) + _bce(logits[n:], 0.0)
            sums[0] += float(d) * n
            sums[1] += float(_bce(logits[n:], 1.0)) * n
            sums[2] += float((logits[:n] > 0).sum() + (logits[n:] < 0).sum()) / 2
            sums[3] += n
            if scorer is not None:
                scorer.add(x.float(), self.to_data(fake))
        d_sum, g_sum, correct, count = pg.all_reduce_sum(sums, self.device)
        out = {}
        if count:
            out = {
                "val_d_loss": d_sum / count,
                "val_g_loss": g_sum / count,
                "val_d_accuracy": correct / count,
            }
        if scorer is not None:
            out.update(scorer.result())
        with policy.autocast():  # every rank: under FSDP the generator's forward is collective
            images = model.generator(self.grid_z.to(policy.param_dtype)).float()
        self.draw(images)
        return out

    def draw(self, images: torch.Tensor) -> None:
        """The epoch's sample grid, on rank 0, in the run folder's samples/."""
        out_dir = self.out_dir
        if not self.is_main or out_dir is None:
            return
        from torchvision.utils import save_image

        folder = out_dir / "samples"
        folder.mkdir(parents=True, exist_ok=True)
        # the epoch just trained, as the console and result.json number it (a resumed run
        # continues the numbering)
        path = folder / f"epoch_{self.data.sampler.epoch}.png"
        save_image((images + 1) / 2, path, nrow=int(self.g.grid**0.5))
        self.last_grid = str(path)

    def finish(self, model, out_dir) -> dict[str, str]:
        """The newest sample grid, for result.json's artifacts."""
        return {"samples": self.last_grid} if self.last_grid else {}

    def info(self) -> dict:
        g, model = self.g, self.model
        return {
            "data_real": self.data.source.real,
            "pin_memory": self.data.train.pin_memory,
            "latent_dim": g.latent_dim,
            "norm": g.norm,
            "parameters": {
                "generator": sum(p.numel() for p in model.generator.parameters()),
                "discriminator": sum(p.numel() for p in model.discriminator.parameters()),
            },
            "score": "classifier features (fid_classifier), classifier_score"
            if g.classifier
            else None,
        }

    def workload(self) -> Workload:
        data, cfg = self.data, self.cfg
        return Workload(
            model=self.model,
            spec=GanSpec(),
            train=self.loader(data.train, cfg.data.prefetch_to_device),
            val=self.loader(data.val, False) if data.val is not None else None,
            sampler=data.sampler,
            loss=_no_single_loss,
            evaluate=self.evaluate,
            parts={"generator": self.model.generator, "discriminator": self.model.discriminator},
            step=self.step,
            finish=self.finish,
            info=self.info(),
            rows=data.rows(),
        )


def _backward(loss: torch.Tensor, scaler) -> None:
    (scaler.scale(loss) if scaler else loss).backward()


def _update(opt, scaler) -> None:
    scaler.step(opt) if scaler else opt.step()


def _skip(loss: torch.Tensor, opt_d, opt_g) -> tuple[torch.Tensor, None, bool]:
    """A step whose loss or gradients were not finite: no update, the gradients dropped."""
    for opt in (opt_d, opt_g):
        opt.zero_grad(set_to_none=True)
    return loss.detach(), None, False


def build(ctx: BuildContext) -> Workload:
    return Gan(ctx).workload()


TASK = Task(
    name="gan",
    reads=IMAGE_SOURCES,
    layouts=frozenset({"single", "ddp", "fsdp"}),
    check=check,
    preflight=preflight,
    build=build,
    describes="a DCGAN generator and discriminator, alternating updates, held-out D/G losses",
    family=GanSpec.traits,
    unread=("lora", *IMAGE_UNREAD),
    imports=lambda cfg: ("torchvision",),
    held_out_line=held_out_line,
)
