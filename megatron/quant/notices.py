"""megatron-core's known, harmless start-up notices, hidden from the commands' consoles (training, the
report, compare_formats, studies) and counted, so that a run's first screen shows the run
(``hide_known`` once, before megatron-core is imported; ``describe_hidden`` for the start line). Any
other warning still shows. A bottom room: the trainer and the report, which must not import each
other, both install it.

On a machine without Transformer Engine and Apex, megatron-core warns at import that it falls
back to its own implementations (seven times on CPU); ``--mock-data`` datasets log that they
have no index cache to save to; megatron-core's own default ``cuda_graph_scope`` warns that it
is deprecated; and megatron-core 0.19 logs that GPTModel is deprecated for HybridModel (which
would change every parameter name: docs/training.md) and, at every save, that its own async save
is deprecated, which a synchronous save does not use.
"""
from __future__ import annotations

import logging
import re
import warnings
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Notice:
    name: str
    message: re.Pattern
    logger: str = ""  # a logging logger's name; empty: a Python warning


KNOWN = (
    Notice("Transformer Engine/Apex fallbacks", re.compile(r"(Transformer Engine and )?Apex (is|are) not installed")),
    Notice("cuda_graph_scope deprecation", re.compile(r"full scope is deprecated")),
    Notice("mock-data index cache", re.compile(r"Unable to save \w+ indexes because path_to_cache is None"),
           "megatron.core.datasets.gpt_dataset"),
    Notice("GPTModel deprecation", re.compile(r"GPTModel IS DEPRECATED"), "megatron.core.models.gpt.gpt_model"),
    Notice("async-save deprecation", re.compile(r"MCore's async save is deprecated"),
           "megatron.core.dist_checkpointing.strategies.torch"),
)
hidden: Counter = Counter()
_installed = False


def hide_known() -> None:
    """Route warnings and the named loggers' records through the known notices (once)."""
    global _installed
    if _installed:
        return
    _installed = True
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if not _counted(str(message), ""):
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    for name in {notice.logger for notice in KNOWN if notice.logger}:
        logging.getLogger(name).addFilter(lambda record, name=name: not _counted(record.getMessage(), name))


def describe_hidden() -> str:
    """"(N known megatron-core notices hidden: name xK, ...)", or "" when none was."""
    if not hidden:
        return ""
    kinds = ", ".join(f"{name} x{count}" for name, count in hidden.items())
    return f"({sum(hidden.values())} known megatron-core notices hidden: {kinds})"


def _counted(message: str, logger: str) -> bool:
    for notice in KNOWN:
        if notice.logger == logger and notice.message.search(message):
            hidden[notice.name] += 1
            return True
    return False
