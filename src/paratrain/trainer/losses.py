"""RunLosses: the training losses of the whole run, across restarts and resumes.

An epoch's train_loss is the mean loss of its applied steps over every data-parallel replica.
A run resumed from a checkpoint (a restarted generation, `--resume`, checkpoint.resume) starts
its process afresh; so that its result still covers the steps before the checkpoint, each
checkpoint's loop state carries (LoopState.losses) the finished epochs' records and each rank's
loss sum of the epoch it is in, with the count of its steps and where they begin. Resumed by
the same ranks, each takes its own sum back and adds the same losses in the same order: the
result equals an uninterrupted run's bit for bit. With other ranks, rank 0 takes the whole sum,
rescaled to this run's count of replicas (the same mean, summed in another order).

A checkpoint without them (written before they were kept) leaves the epochs before it out of the
result and the epoch it is in counted from the resume on. Each epoch record says which steps its
loss averages (train_loss_steps: first and last, 1-based; skipped steps left out), so a result
never covers less than it says.
"""

from __future__ import annotations

import json

import torch

from paratrain.checkpoint import LoopState
from paratrain.distributed import process_group as pg


class RunLosses:
    """rank, world: this process's place (the sums are per rank); replicas: the processes
    whose losses an epoch's mean divides by (world // pp); device: the collective's."""

    def __init__(
        self, state: LoopState, *, rank: int, world: int, replicas: int, device: torch.device
    ):
        self.rank, self.world, self.replicas, self.device = rank, world, replicas, device
        carried = state.losses or {}
        self.epochs: list[dict] = list(carried.get("epochs", []))
        """The finished epochs' records, those before this run's start included."""
        self.resumed: dict | None = None
        if carried.get("sums") is not None and carried.get("epoch") == state.epoch:
            self.resumed = carried
        self.from_step = self.counted_from = state.step
        """The step after which the epoch's loss sum begins; the one after which this run's
        steps are counted (the steps before it: carried_good)."""
        self.carried_good = 0

    def begin(self, state: LoopState) -> float:
        """An epoch begins, or goes on where a checkpoint left it -> this rank's loss sum of it
        so far (0 unless resumed with the checkpoint's sums)."""
        carried, self.resumed = self.resumed, None
        self.from_step = self.counted_from = state.step
        self.carried_good = 0
        if carried is None or carried["epoch"] != state.epoch:
            return 0.0
        self.from_step = state.step - state.step_in_epoch + carried["from_in_epoch"]
        self.carried_good = carried["good"]
        return self.own_sum(carried)

    def own_sum(self, carried: dict) -> float:
        """This rank's share of a checkpoint's sums: its own where the same ranks average the
        same way; else all of them on rank 0, rescaled to this run's count of replicas."""
        sums = carried["sums"]
        if len(sums) == self.world and carried["replicas"] == self.replicas:
            return float(sums[self.rank])
        return sum(sums) / carried["replicas"] * self.replicas if self.rank == 0 else 0.0

    def good_steps(self, state: LoopState) -> int:
        """Steps the epoch's loss sum holds: the checkpoint's, and this run's less the skipped
        ones."""
        skipped = sum(self.counted_from < b <= state.step for b in state.bad_steps)
        return self.carried_good + state.step - self.counted_from - skipped

    def covered(self, state: LoopState) -> list[int] | None:
        """The first and last step (1-based) the epoch's loss averages, or None for none."""
        return [self.from_step + 1, state.step] if state.step > self.from_step else None

    def ended(self, record: dict, complete: bool) -> None:
        """An epoch's record; one that ran to its end is kept for the checkpoints after it (an
        epoch cut short by train.max_steps goes on in a run resumed with more steps)."""
        if complete:
            self.epochs.append(plain(record))

    def carry(self, state: LoopState, loss_sum: torch.Tensor | None) -> None:
        """Into the loop state a checkpoint is about to save: the finished epochs and every
        rank's loss sum of this epoch (a collective: every rank calls it before the save)."""
        begun = loss_sum is not None and state.step_in_epoch > 0  # else nothing of it yet
        # each rank's sum in its own slot: adding zeros leaves every sum as it was, bit for bit
        slots = [0.0] * self.world
        slots[self.rank] = float(loss_sum.item()) if begun else 0.0
        state.losses = {
            "epochs": list(self.epochs),
            "epoch": state.epoch,
            "sums": pg.all_reduce_sum(slots, self.device),
            "replicas": self.replicas,
            "good": self.good_steps(state) if begun else 0,
            # where the sums begin, counted from the epoch's start (a layout resumed with other
            # step sizes numbers its steps anew)
            "from_in_epoch": self.from_step - (state.step - state.step_in_epoch) if begun else 0,
        }


def plain(record: dict) -> dict:
    """The record as JSON's plain values (a checkpoint's loop state loads no other types)."""
    return json.loads(json.dumps(record, default=_number))


def _number(value) -> float | str:
    try:
        return float(value)  # a 0-d tensor, a numpy float
    except (TypeError, ValueError):
        return str(value)
