"""paratrain: train PyTorch models on one GPU, many GPUs and many nodes, and measure which way is
fastest for your model.

    import paratrain
    result = paratrain.train("recipes/tiny_lora_cpu.yaml", {"train.max_steps": 5})
"""

__version__ = "0.1.0"


def train(recipe=None, overrides=None):
    """paratrain.api.train: train as `paratrain run` does and return the result."""
    from paratrain.api import train as _train

    return _train(recipe, overrides)


def load_config(recipe=None, overrides=None):
    """paratrain.api.config: a recipe (or the defaults) with {"dotted.key": value} overrides."""
    from paratrain.api import config

    return config(recipe, overrides)


def __getattr__(name):
    if name == "UserError":  # lazily: importing paratrain stays light
        from paratrain.errors import UserError

        return UserError
    raise AttributeError(name)
