"""The one reader of the process environment in megatron.quant: ``read_environment``.

A training run builds its configuration from it once (``training.run_tree``); library use without
the trainer (layers built by megatron-core with our backend spec, ``CUSTOM_QUANT_TYPE`` choosing the
recipe) reaches the same function through the readers' ``environ=None`` default, so every variable
megatron.quant acts on is read here and nowhere else (tests/test_run_config.py holds the rule).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Iterator, Mapping, Optional

from megatron.quant.settings.switches import switch_value
from megatron.quant.settings.variables import CAPTURE_PREFIXES, DIE_WITH_PARENT, RECIPE_PREFIX

_PREFIXES = (RECIPE_PREFIX, *CAPTURE_PREFIXES)
LAUNCHER_VARIABLES = {"world_size": "WORLD_SIZE", "rank": "RANK", "local_rank": "LOCAL_RANK"}  # field -> variable


def _integer(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit():
        raise ValueError(f"{name}={text[:40]!r} is not a non-negative integer (torchrun sets it)")
    return int(text)


@dataclass(frozen=True)
class Environment:
    """The variables megatron.quant acts on, as the process was started with them."""

    settings: Mapping[str, str] = field(default_factory=dict)  # CUSTOM_QUANT_*, TENSOR_SAVE*, TENSOR_INSPECT_*
    world_size: int = 1                 # WORLD_SIZE: processes in the run (torchrun; 1 without it)
    rank: Optional[int] = None          # RANK: this process's rank; None: not started by a launcher
    local_rank: int = 0                 # LOCAL_RANK: this process's GPU on its node
    triton_interpret: bool = False      # TRITON_INTERPRET: Triton kernels run in its CPU interpreter
    die_with_parent: bool = False       # MEGATRON_QUANT_DIE_WITH_PARENT=1: a sweep started this trainer
    visible_devices: Optional[str] = None  # CUDA_VISIBLE_DEVICES as given (None: unset)
    launcher: frozenset[str] = frozenset()  # which of LAUNCHER_VARIABLES were set (the others: their defaults)

    def first_rank(self) -> bool:
        """Rank 0, or a process no launcher started: the one that prints a run's notices."""
        return not self.rank


def _interpreting(environ: Mapping[str, str]) -> bool:
    return bool(switch_value(environ.get("TRITON_INTERPRET", "")))


def triton_interpreting() -> bool:
    """``read_environment().triton_interpret`` for a kernel launch, without copying the environment."""
    return _interpreting(os.environ)


def _settings(source: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType({key: value for key, value in source.items() if key.startswith(_PREFIXES)})


def read_environment(environ: Optional[Mapping[str, str]] = None) -> Environment:
    """The ``Environment`` of ``environ`` (None: this process's ``os.environ``, read here and only here)."""
    source = os.environ if environ is None else environ
    return Environment(
        settings=_settings(source),
        world_size=_integer(source, "WORLD_SIZE", 1),
        rank=_integer(source, "RANK", 0) if "RANK" in source else None,
        local_rank=_integer(source, "LOCAL_RANK", 0),
        triton_interpret=_interpreting(source),
        die_with_parent=source.get(DIE_WITH_PARENT) == "1",
        visible_devices=source.get("CUDA_VISIBLE_DEVICES"),
        launcher=frozenset(name for name in LAUNCHER_VARIABLES.values() if source.get(name, "").strip()))


def settings_of(environ: Optional[Mapping[str, str]] = None) -> Mapping[str, str]:
    """The recipe's and capture's variables: ``environ`` when given (a caller's own mapping), else the process's."""
    return _settings(os.environ) if environ is None else environ  # not the launcher's variables: not parsed


def child_environment(drop: Iterable[str] = ()) -> dict[str, str]:
    """This process's environment without ``drop``: the start of a child process's (a sweep's run)."""
    dropped = set(drop)
    return {key: value for key, value in os.environ.items() if key not in dropped}


@contextlib.contextmanager
def scoped_environ(env: Mapping[str, str]) -> Iterator[None]:
    """Set ``env`` inside the block (for the runs a study starts); afterwards every key has its previous
    value (or none) again."""
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
