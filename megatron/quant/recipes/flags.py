"""On/off words accepted wherever a setting is a switch (env vars and recipe files)."""
from __future__ import annotations

from typing import Optional

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def switch_value(text: str) -> Optional[bool]:
    """True or False for an on/off word (any case, surrounding spaces ignored); None otherwise."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return None
