"""Run code under extra environment variables (the quantization and capture settings are env vars)."""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Mapping


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
