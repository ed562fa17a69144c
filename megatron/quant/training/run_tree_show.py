"""``--print-config``: the resolved run tree, one ``section.field = value  (source)`` line each."""
from __future__ import annotations

from dataclasses import fields

from megatron.quant.settings.environment import LAUNCHER_VARIABLES
from megatron.quant.training.run_tree import SECTIONS, RunTree


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
    for key, variable in LAUNCHER_VARIABLES.items():
        source = f"environment {variable}" if variable in environment.launcher else "default"
        lines.append(f"  {key} = {vars(environment)[key]!r}  ({source})")
    lines += [f"  {key} = {value!r}  (environment {key})" for key, value in sorted(environment.settings.items())]
    lines += [f"notice: {notice}" for notice in tree.notices]
    return "\n".join(lines)
