"""Every YAML the lab reads (recipes, study plans) goes through ``load_yaml``: PyYAML's safe loader
with alias expansion bounded, so a few hundred bytes of nested aliases (an alias bomb, "billion
laughs") are refused before they expand into gigabytes. Imports nothing of ours."""
from __future__ import annotations

from typing import Any

import yaml

# A recipe or a plan is a few hundred values; more through YAML aliases is an alias bomb.
MAX_YAML_VALUES = 100_000


class YamlError(ValueError):
    """A document whose aliases expand beyond the bound; one line naming the source."""


def _yaml_size(node: yaml.Node, sizes: dict[int, int], limit: int) -> int:
    """The values ``node`` expands to with its aliases followed (shared nodes counted per use),
    without expanding them; above ``limit`` (or a cycle) counts as too many."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    sizes[key] = limit + 1  # while counting: a node that contains itself is too large
    children = ([part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode)
                else node.value if isinstance(node, yaml.SequenceNode) else [])
    total = 1
    for child in children:
        total += _yaml_size(child, sizes, limit)
        if total > limit:
            break
    sizes[key] = min(total, limit + 1)
    return sizes[key]


def load_yaml(text: str, source: str, limit: int = MAX_YAML_VALUES) -> Any:
    """The document in ``text`` (None when empty); YamlError names ``source`` when its aliases expand
    to more than ``limit`` values; text that is not YAML raises PyYAML's ``yaml.YAMLError``."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _yaml_size(node, {}, limit) > limit:
            raise YamlError(f"{source}: expands to more than {limit} values through YAML aliases; refused")
        return loader.construct_document(node)
    finally:
        loader.dispose()
