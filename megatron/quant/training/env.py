"""Run code under extra environment variables (the quantization and capture settings are env vars)."""
from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Iterator, Mapping

from megatron.quant.formats.show import show_value

_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@contextlib.contextmanager
def scoped_environ(env: Mapping[str, str]) -> Iterator[None]:
    """Set ``env`` inside the block; afterwards every key has its previous value (or none) again."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def environment_problem(environment: Mapping[Any, Any]) -> str | None:
    """What makes ``environment`` unusable as variables (a name a shell or ``os.environ`` refuses, a
    value that is no string or number), in one bounded line; None when it is fine."""
    for key, value in environment.items():
        if not (isinstance(key, str) and _VARIABLE.fullmatch(key)):
            return (f"{show_value(key)} is not a variable name; allowed: letters, digits and '_', not starting "
                    f"with a digit")
        if value is None or isinstance(value, (dict, list)):
            return f"{key}: expected a string or number, got {show_value(value)}"
    return None
