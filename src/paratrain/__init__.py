"""paratrain: train PyTorch models on one GPU, many GPUs and many nodes, and measure which way is
fastest for your model.

    import paratrain
    result = paratrain.train("recipes/tiny_lora_cpu.yaml", {"train.max_steps": 5})
"""

import logging
import os
import warnings

from paratrain.version import __version__  # noqa: F401  (paratrain.__version__)


def _quiet_enum_registration(record: logging.LogRecord) -> bool:
    """torchao registers its enums with torch's pytree at import; torch >= 2.12 warns that this
    is deprecated, two lines in every process: a message for torchao's authors, not for a
    user of paratrain. Other pytree warnings pass."""
    return "is an Enum subclass and is now natively supported" not in record.getMessage()


logging.getLogger("torch.utils._pytree").addFilter(_quiet_enum_registration)


class _TorchaoKernels(logging.Filter):
    """torchao built for another torch logs a warning per compiled kernel it cannot load
    ("Failed to load .../_C_mxfp8...so: undefined symbol ...") in every process that imports
    it, a checkpoint's load included. paratrain's uses of torchao (float8 layers, low-bit
    optimizers) do not need those kernels: one line says so and where the mend is, once a
    process and on rank 0 only (every rank would say the same); the others are dropped."""

    said = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("Failed to load ") and "incompatible torch" not in message:
            return True
        if self.said or os.environ.get("RANK", "0") != "0":
            return False
        self.said = True
        record.msg, record.args = (
            "torchao's compiled kernels do not load beside this torch (built for another "
            "torch); paratrain does not use them. `python -m paratrain.install` names the mend",
            None,
        )
        return True


logging.getLogger("torchao").addFilter(_TorchaoKernels())
# peft asks transformers (>= 5) for a property it renamed, in every process of a LoRA run:
# theirs to change, nothing the user can act on.
warnings.filterwarnings(
    "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
)


def train(recipe=None, overrides=None, **objects):
    """paratrain.api.train: train as `paratrain run` does and return the result; objects:
    model=, train_data=, val_data=, loss= (your own, instead of the recipe's)."""
    from paratrain.api import train as _train

    return _train(recipe, overrides, **objects)


def load_config(recipe=None, overrides=None):
    """paratrain.api.config: a recipe (or the defaults) with {"dotted.key": value} overrides."""
    from paratrain.api import config

    return config(recipe, overrides)


def __getattr__(name):
    if name == "UserError":  # lazily: importing paratrain stays light
        from paratrain.errors import UserError

        return UserError
    raise AttributeError(name)
