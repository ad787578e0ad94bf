"""Entry point of each process that torchrun's agent starts: ``python -m paratrain.worker CONFIG``,
or, on the CPU, `forked` (the agent forks its workers from a fork server that imported what
they need once: launch.run_torchrun).

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


# Set by torchrun's agent for each worker; everything else comes from the launching process.
AGENT_KEYS = {
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
}


def forked(config_path: str, environ: dict[str, str]) -> None:
    """A worker forked by torchrun's agent from its fork server (launch.run_torchrun): the
    launching process's environment of this launch (the fork server keeps the one it started
    with), then main."""
    import os

    ours = {k for k in os.environ if k in AGENT_KEYS or k.startswith("TORCHELASTIC_")}
    for key in [k for k in os.environ if k not in ours and k not in environ]:
        del os.environ[key]
    os.environ.update({k: v for k, v in environ.items() if k not in ours})
    # unbuffered, as `python -u` makes a worker's output: a killed rank's last words and a
    # progress bar's "\r" updates are out at once
    import io

    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        raw = os.fdopen(old.fileno(), "wb", buffering=0, closefd=False)
        setattr(
            sys,
            name,
            io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors, write_through=True),
        )
    code = main([config_path])
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
