"""Every YAML the lab reads (recipes, precision files, inspect configs, study plans) goes through
``load_yaml``: PyYAML's safe loader with alias expansion bounded, so a few hundred bytes of nested
aliases (an alias bomb, "billion laughs") are refused before they expand into gigabytes.
``read_text_file`` reads a file a user names by hand: a regular file of bounded size, opened without
blocking, so a FIFO, a device (``/dev/zero``) or a file of tens of MB is refused in one line before
it hangs the start or fills memory. Imports nothing of ours."""
from __future__ import annotations

import os
import stat
from typing import Any

import yaml

# Aliases may add at most this many values to what the document writes out: a recipe or a plan is a
# few hundred values, an inspect config's longest lists a few hundred thousand (written, not aliased).
MAX_YAML_VALUES = 100_000
# A configuration file is a few kB; 1 MiB (a start_end_list of 40,000 pairs is ~700 kB) bounds the memory and
# the time PyYAML's parser takes on a file named by hand (it reads some 50 kB a second on a slow core).
MAX_FILE_BYTES = 1024 * 1024


class YamlError(ValueError):
    """A document whose aliases expand beyond the bound, or a file that cannot be a configuration;
    one line naming the source."""


def read_text_file(path: str | os.PathLike, source: str, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of the regular file at ``path``; YamlError (naming ``source``) for a missing
    file, a directory, a FIFO, a device or socket, a file over ``limit`` bytes, or bytes that are not
    UTF-8. The file is opened non-blocking (a FIFO with no writer does not hang) and read at most
    ``limit`` + 1 bytes (a file that grows while read is still bounded)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise YamlError(f"{source}: cannot read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
        raise YamlError(f"{source}: is {kind}; give a regular file")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise YamlError(f"{source}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise YamlError(f"{source}: larger than {limit // 1024} kB; a configuration file is a few kB, and "
                        f"this bound keeps its parse to seconds")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlError(f"{source}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                        f"save it as UTF-8") from None


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
    """The document in ``text`` (None when empty); YamlError names ``source`` when its aliases add more
    than ``limit`` values to those it writes out; text that is not YAML raises PyYAML's ``yaml.YAMLError``.
    A document without aliases is bounded by its size alone (``read_text_file``)."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlError(f"{source}: nested too deeply to be a configuration") from None
        if node is None:
            return None
        sizes: dict[int, int] = {}  # node -> its expanded size; its length: the nodes written out
        # a document writes out at most one value per character, so a count above this cap is aliases'
        try:
            expanded = _yaml_size(node, sizes, len(text) + 1 + limit)
        except RecursionError:
            raise YamlError(f"{source}: nested too deeply to be a configuration") from None
        if expanded - len(sizes) > limit:
            raise YamlError(f"{source}: expands to more than {limit} values through YAML aliases; refused")
        return loader.construct_document(node)
    finally:
        loader.dispose()

