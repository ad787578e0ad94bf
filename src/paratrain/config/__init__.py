"""The run's settings, as leaves: one dataclass per part (data.py, model.py, parallel.py,
train.py, launch.py, gan.py), composed by RunConfig (run.py), parsed from YAML and `--set`
by pydantic (parse.py), shown as YAML and `--list-keys` (keys.py).

This package imports no part of paratrain (no task, model, parallel, trainer or data code:
the import contract in pyproject.toml holds it to that), so every part may import it. What the
settings come to on a machine (degrees, wrapper, sampler, task, sources) is decided in one
place, paratrain.runplan.resolve.
"""

from paratrain.config.keys import all_keys, describe_keys, field_docs, for_task, to_yaml
from paratrain.config.levers import PLAIN, plain_levers
from paratrain.config.parse import (
    from_dict,
    load_config,
    parse_override,
    read_yaml,
    recipe_dict,
    set_dotted,
)
from paratrain.config.run import RunConfig, Strategy, TaskName

__all__ = [
    "PLAIN",
    "plain_levers",
    "RunConfig",
    "Strategy",
    "TaskName",
    "all_keys",
    "describe_keys",
    "field_docs",
    "for_task",
    "from_dict",
    "load_config",
    "parse_override",
    "read_yaml",
    "recipe_dict",
    "set_dotted",
    "to_yaml",
]
