"""Loading a Hugging Face checkpoint on every rank with at most one progress bar: transformers
draws its "Loading weights" bar in each process, so N ranks printed N bars before the run's
plan; and in a log file or a pipe a bar is no bar but lines of its redraws, ahead of the plan.
And a model built from a config without running a folder's own code unasked (from_config)."""

from __future__ import annotations

import contextlib
import os
import sys


def _terminal() -> bool:
    """stdout and stderr both a terminal (the bar draws on stderr, the plan prints on stdout:
    either one in a file would hold the bar's lines, or lines out of order, before the
    plan)."""
    return all(stream is not None and stream.isatty() for stream in (sys.stdout, sys.stderr))


@contextlib.contextmanager
def one_bar():
    """transformers' progress bars off in this block on every rank but 0 (RANK, as torchrun
    sets it; no RANK: one process, its bar kept), and on rank 0 too where its output is no
    terminal; as they were after it."""
    from transformers.utils import logging as hf_logging

    rank0 = int(os.environ.get("RANK", "0")) == 0
    if (rank0 and _terminal()) or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def from_config(auto, config, path, **kwargs):
    """auto.from_config (an AutoModel class), its refusal of a folder's own code (auto_map
    without trust_remote_code) as one line naming --trust-code."""
    from paratrain import trust

    try:
        return auto.from_config(config, **kwargs)
    except ValueError as e:
        found = trust.remote_code(e, "model.path", path)
        if found is None:
            raise
        raise found from None
