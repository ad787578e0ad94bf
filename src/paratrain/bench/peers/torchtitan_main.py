"""torchtitan's own entry point (torchtitan.train run as __main__, its Trainer unchanged),
started by torchrun for the torchtitan peer. One thing first: torchtitan imports its Hugging Face
data set loaders (and so the `datasets` package) at start-up, though the peer's rows come from
its own loader (torchtitan_spec.RowsLoader). Where `datasets` is not installed (the GPU machine
has no room to carry pyarrow), those two loader builders are registered as functions that
refuse to run, so the import succeeds and nothing of torchtitan's training path changes."""

from __future__ import annotations

import importlib.util
import runpy
import sys
import types


def _refuse(*args, **kwargs):
    raise RuntimeError("torchtitan's HF data sets are not installed; the peer gives its own rows")


def stand_in_for_hf_datasets() -> None:
    if importlib.util.find_spec("datasets") is not None:
        return
    module = types.ModuleType("torchtitan.hf_datasets.text_datasets")
    module.build_text_dataloader = _refuse
    module.build_text_validation_dataloader = _refuse
    sys.modules[module.__name__] = module
    print("paratrain peer: `datasets` absent; torchtitan's HF loaders stubbed out", flush=True)


if __name__ == "__main__":
    stand_in_for_hf_datasets()
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
