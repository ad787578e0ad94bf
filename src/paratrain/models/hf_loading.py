"""Loading a Hugging Face checkpoint on every rank with one progress bar: transformers draws its
"Loading weights" bar in each process, so N ranks printed N bars before the run's plan."""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def one_bar():
    """transformers' progress bars off in this block on every rank but 0 (RANK, as torchrun
    sets it; no RANK: one process, its bar kept), as they were after it."""
    from transformers.utils import logging as hf_logging

    if int(os.environ.get("RANK", "0")) == 0 or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()
