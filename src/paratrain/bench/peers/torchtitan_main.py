"""torchtitan's own entry point (torchtitan.train run as __main__, its Trainer unchanged),
started by torchrun for the torchtitan peer. One thing first: torchtitan imports its Hugging Face
data set loaders (and so the `datasets` package) at start-up, though the peer's rows come from
its own loader (torchtitan_spec.RowsLoader). Where `datasets` is not installed (the GPU machine
has no room to carry pyarrow), its loader module is registered with stand-ins that refuse to run
(0.2: the two loader builders; 0.3: the HuggingFaceTextDataLoader class, whose Config its
validator's default names), so the import succeeds and nothing of torchtitan's training path
changes. From torchtitan 0.3 on, the peer's config module is imported first, so an error in it
shows itself (torchtitan's --module lookup would report only that the module was not found)."""

from __future__ import annotations

import importlib.util
import runpy
import sys
import types


def _refuse(*args, **kwargs):
    raise RuntimeError("torchtitan's HF data sets are not installed; the peer gives its own rows")


def _v03_loader_class() -> type:
    """torchtitan 0.3's HuggingFaceTextDataLoader in name and Config fields only."""
    from dataclasses import dataclass

    from torchtitan.components.dataloader import BaseDataLoader

    class HuggingFaceTextDataLoader(BaseDataLoader):
        @dataclass(kw_only=True, slots=True)
        class Config(BaseDataLoader.Config):
            dataset: str = "c4_test"
            infinite: bool = True

        __init__ = __iter__ = state_dict = load_state_dict = _refuse

    return HuggingFaceTextDataLoader


def stand_in_for_hf_datasets(api: str = "v02") -> None:
    if importlib.util.find_spec("datasets") is not None:
        return
    module = types.ModuleType("torchtitan.hf_datasets.text_datasets")
    if api == "v03":
        module.HuggingFaceTextDataLoader = _v03_loader_class()
    else:
        module.build_text_dataloader = _refuse
        module.build_text_validation_dataloader = _refuse
    sys.modules[module.__name__] = module
    print("paratrain peer: `datasets` absent; torchtitan's HF loaders stubbed out", flush=True)


if __name__ == "__main__":
    from paratrain.bench.peers.torchtitan_args import V03_MODULE, api, installed_version

    which = api(installed_version())
    stand_in_for_hf_datasets(which)
    if which == "v03":
        importlib.import_module(V03_MODULE)
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
