"""The step log: a JSON line every log.every_steps on rank 0, and the same scalars as
TensorBoard events that tensorboard's own reader reads back."""

import json

import pytest
from conftest import TINY_LM, train

from paratrain.config import load_config


def test_step_log_and_tensorboard_hold_the_runs_points(tmp_path):
    out = tmp_path / "run"
    settings = [*TINY_LM, "lora.enabled=false", "train.max_steps=6", "log.every_steps=2"]
    result = train(load_config(None, [*settings, f"output_dir={out}"]))
    points = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert [p["step"] for p in points] == [2, 4, 6]
    for p in points:
        assert p["loss"] > 0 and p["lr"] > 0 and p["grad_norm"] > 0 and p["tokens_per_s"] > 0
    # the points' losses average to the epoch's (6 steps, one epoch)
    mean = sum(p["loss"] for p in points) / 3
    assert mean == pytest.approx(result["epochs"][0]["train_loss"], rel=1e-6)
    assert result["artifacts"]["steps"] == str(out / "steps.jsonl")
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # loss, throughput

    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [2, 4, 6]
    assert [e.value for e in loss] == pytest.approx([p["loss"] for p in points], rel=1e-6)
    assert "train/grad_norm" in events.Tags()["scalars"]


def test_the_step_log_can_be_off(tmp_path):
    out = tmp_path / "run"
    settings = [*TINY_LM, "train.max_steps=2", "log.steps=false", "log.tensorboard=false"]
    result = train(load_config(None, [*settings, f"output_dir={out}"]))
    assert not (out / "steps.jsonl").exists() and not (out / "tensorboard").exists()
    assert "steps" not in result["artifacts"]


def test_weights_and_biases_gets_the_same_points(tmp_path, monkeypatch):
    """log.wandb=true, offline (wandb's files in the run folder): every point of the step log
    logged to the wandb run at its step, the run named and configured; a machine without
    wandb is told so before anything starts."""
    from paratrain.errors import UserError
    from paratrain.runner import preflight

    out = tmp_path / "run"
    settings = [*TINY_LM, "lora.enabled=false", "train.max_steps=4", "log.every_steps=2"]
    settings += ["log.wandb=true", "name=wb-test", f"output_dir={out}"]
    cfg = load_config(None, settings)
    try:
        import wandb
    except ImportError:
        with pytest.raises(UserError, match="log.wandb: the wandb package is not installed"):
            preflight(cfg, 1)
        pytest.skip("wandb is not installed: only the refusal was checked")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    seen, real_init = [], wandb.init

    def init(**kwargs):
        run = real_init(**kwargs)
        real_log = run.log
        seen.append(kwargs)

        def log(data, step=None, **more):
            seen.append((step, dict(data)))
            return real_log(data, step=step, **more)

        run.log = log
        return run

    monkeypatch.setattr(wandb, "init", init)
    train(cfg)
    points = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    first, *logged = seen
    assert first["name"] == "wb-test" and first["config"]["train"]["max_steps"] == 4
    assert [step for step, _ in logged] == [2, 4]
    for (_, data), point in zip(logged, points, strict=True):
        assert data["train/loss"] == point["loss"] and data["train/grad_norm"] > 0
    (events,) = (out / "wandb").glob("offline-run-*/run-*.wandb")  # wandb wrote its run
    assert events.stat().st_size > 0


class LandsLater:
    """A CUDA event's stand-in: its copies land when the test says."""

    def __init__(self):
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


def test_a_point_waits_for_its_values_in_order_and_the_end_waits_for_all():
    """Reporter.flush: a point whose GPU values are still being copied is held, and the points
    after it with it (the log stays in step order); once they land both are written; at an
    epoch's end or the close every point is written, waiting for its copies."""
    from collections import deque

    from paratrain.trainer.report import Point, Reporter

    reporter = object.__new__(Reporter)  # flush() needs only its queue and emit()
    written = []
    reporter.emit = lambda point: written.append(point.step)
    first, third = LandsLater(), LandsLater()
    points = [(2, first), (4, None), (6, third)]
    reporter.pending = deque(
        Point(s, s, 0.0, 0.0, 0.1, None, False, True, {}, e) for s, e in points
    )
    reporter.flush(wait=False)
    assert written == []
    first.done = True
    reporter.flush(wait=False)
    assert written == [2, 4]
    reporter.flush(wait=True)
    assert written == [2, 4, 6] and third.done and not reporter.pending


def test_sent_values_are_the_steps_own():
    """send(): a tensor's value as it was at the point (the loss sum grows in place after it)."""
    import torch

    from paratrain.trainer.report import number, send

    loss_sum = torch.tensor(3.0)
    values, landed = send({"loss_sum": loss_sum, "grad_norm": 0.5, "loss_scale": None})
    loss_sum += 1.0
    assert landed is None  # no CUDA tensor: nothing on its way
    assert [number(values[k]) for k in ("loss_sum", "grad_norm", "loss_scale")] == [3.0, 0.5, None]


def test_a_failed_runs_last_points_are_written_and_a_gpu_error_does_not_hide_its_own():
    """Reporter.salvage (fit's finally): the points still on their way are written; if waiting
    for them fails too (the GPU's own error), nothing is raised over the run's error."""
    from collections import deque

    from paratrain.trainer.report import Point, Reporter

    class Broken(LandsLater):
        def synchronize(self) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    reporter = object.__new__(Reporter)
    written = []
    reporter.emit = lambda point: written.append(point.step)
    reporter.pending = deque([Point(3, 3, 0.0, 0.0, 0.1, None, False, True, {}, LandsLater())])
    reporter.salvage()
    assert written == [3] and not reporter.pending
    reporter.pending = deque([Point(6, 6, 0.0, 0.0, 0.1, None, False, True, {}, Broken())])
    reporter.salvage()
    assert written == [3] and not reporter.pending


def test_a_point_does_not_wait_for_the_device(tmp_path, monkeypatch):
    """A log point takes the host's clock (TrainClock.queued): a point every step syncs the
    device no more often than one point a run (the sync drained the GPU's queue at each point:
    MobileNetV2 on one H200, 2026-12-03). metrics.sync is what a wait for the device goes
    through (metrics.now)."""
    from paratrain.meters import metrics

    real, calls = metrics.sync, []

    def counted(device):
        calls.append(device)
        return real(device)

    monkeypatch.setattr(metrics, "sync", counted)
    settings = [*TINY_LM, "lora.enabled=false", "train.max_steps=6", "log.tensorboard=false"]
    syncs = {}
    for every in (1, 6):
        calls.clear()
        out = tmp_path / f"every{every}"
        train(load_config(None, [*settings, f"log.every_steps={every}", f"output_dir={out}"]))
        assert len((out / "steps.jsonl").read_text().splitlines()) == 6 // every
        syncs[every] = len(calls)
    assert syncs[1] == syncs[6] > 0
