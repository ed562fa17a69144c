"""The one rule for recipe names: a recipe's name is the capture directory under TENSOR_SAVE_DIR
and a token of every capture file name, so it is checked when the recipe is read, not at the
first capture (where a bad name would stop training mid-run or silently capture nothing)."""
from __future__ import annotations

import re
from typing import Optional

# ASCII letters, digits and . + - joined by single underscores (the file-name parser splits on '_');
# no leading '.' ('.' and '..' would put captures beside or above TENSOR_SAVE_DIR, '.x' would hide them).
NAME_RE = re.compile(r"^[A-Za-z0-9+-][A-Za-z0-9.+-]*(?:_[A-Za-z0-9.+-]+)*$")
# A capture file name adds about 110 characters to the name; file systems allow 255.
MAX_NAME_LENGTH = 64
NAME_RULE = (f"ASCII letters, digits and . + - joined by single underscores, not starting with '.', "
             f"at most {MAX_NAME_LENGTH} characters (it becomes a directory and file-name token)")


def name_problem(name: object) -> Optional[str]:
    """Why ``name`` cannot be a recipe name (None when it can)."""
    if not isinstance(name, str):
        return f"{type(name).__name__}, not a string"
    if len(name) > MAX_NAME_LENGTH:
        return f"{len(name)} characters"
    return None if NAME_RE.match(name) else "not of the allowed characters"
