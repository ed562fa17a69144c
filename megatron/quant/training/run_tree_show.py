"""``--print-config``: the resolved run tree, one ``section.field = value  (source)`` line each."""
from __future__ import annotations

from dataclasses import fields

from megatron.quant.training.run_tree import SECTIONS, RunTree

_LAUNCH = {"world_size": "WORLD_SIZE", "rank": "RANK", "local_rank": "LOCAL_RANK"}


def show_run_tree(tree: RunTree) -> str:
    """Every field of ``tree`` with its value and where it came from (``run_tree.SOURCES``), by section;
    then the launcher's variables and every CUSTOM_QUANT_*/TENSOR_SAVE_* variable as given."""
    lines = []
    for name in (*SECTIONS, "quant"):
        section = vars(tree)[name]
        lines.append(f"[{name}]  {type(section).__doc__.splitlines()[0]}")
        lines += [f"  {item.name} = {vars(section)[item.name]!r}  ({tree.sources[f'{name}.{item.name}']})"
                  for item in fields(section)]
    environment = tree.environment
    lines.append("[environment]  the launcher's variables and every setting variable as given")
    for key, variable in _LAUNCH.items():
        value = vars(environment)[key]
        lines.append(f"  {key} = {value!r}  ({'default' if value is None else 'environment ' + variable})")
    lines += [f"  {key} = {value!r}  (environment {key})" for key, value in sorted(environment.settings.items())]
    lines += [f"notice: {notice}" for notice in tree.notices]
    return "\n".join(lines)
