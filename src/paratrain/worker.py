"""Entry point of each process that torchrun's agent starts: ``python -m paratrain.worker CONFIG``.

The config was resolved and validated by the launching command and written as YAML; a worker
only loads it and trains.
"""

from __future__ import annotations

import sys

from paratrain.config import load_config
from paratrain.errors import exit_code
from paratrain.trainer.loop import train


def main(argv: list[str]) -> int:
    (config_path,) = argv
    return exit_code(lambda: train(load_config(config_path)))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
