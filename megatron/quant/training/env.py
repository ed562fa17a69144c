"""Whether a study's environment can be given to its runs as variables (``environment_problem``);
``settings.environment.scoped_environ`` sets them."""
from __future__ import annotations

import re
from typing import Any, Mapping

from megatron.quant.formats.show import show_value

_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
