"""`paratrain export`: one checkpoint as one consolidated model."""

from __future__ import annotations

import argparse


def add(sub) -> None:
    export = sub.add_parser(
        "export",
        help="one checkpoint as one consolidated model (a Hugging Face folder, or safetensors)",
        description="Gathers a checkpoint's shards (any layout) in one process on the CPU: a "
        "causal LM becomes a Hugging Face folder (from_pretrained; a LoRA run's adapter in "
        "peft's format), any other model one model.safetensors under its own names.",
    )
    export.add_argument("checkpoint", help="a checkpoint (step_*), or a run folder: its newest")
    export.add_argument("out", help="a new folder for the model")
    export.add_argument("--config", help="the run's config.yaml (default: the run folder's)")
    export.add_argument(
        "--trust-code",
        action="store_true",
        help="run the code the config names (a model folder's own modules, compile_options' "
        "commands); as `paratrain run --trust-code`",
    )
    export.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    import os

    from paratrain.export.consolidate import export
    from paratrain.trust import TRUST_ENV

    if args.trust_code:  # as `paratrain run --trust-code`; a config cannot set it
        os.environ[TRUST_ENV] = "1"

    written = export(args.checkpoint, args.out, args.config)
    print(
        f"paratrain: step {written['step']} of {written['source']} -> {args.out} "
        f"({written['format']}: {', '.join(written['files'])})"
    )
    return 0
