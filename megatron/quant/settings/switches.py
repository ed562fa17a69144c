"""Settings read from the environment and recipe files: the on/off words accepted wherever a
setting is a switch, and the refusal of unknown names under a variable prefix."""
from __future__ import annotations

from typing import Iterable, Mapping, Optional

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


def unknown_variables(environ: Mapping[str, str], prefixes: tuple[str, ...], known: Iterable[str],
                      what: str) -> Optional[str]:
    """The error for variables named with one of ``prefixes`` but not ``known`` (a misspelling such
    as CUSTOM_QUANT_TPYE would otherwise be ignored); None when there is none."""
    known = tuple(known)
    unknown = sorted(key for key in environ if key.startswith(prefixes) and key not in known)
    if not unknown:
        return None
    return f"unknown {what} variable(s) {', '.join(unknown)}; known: {', '.join(known)}"
