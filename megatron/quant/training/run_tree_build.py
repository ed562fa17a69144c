"""``build_run_tree``: the one place a training run reads its command line and its environment.

The flags are parsed and checked by ``arguments`` (Megatron-LM's names and rules); the environment is
read by ``settings.environment.read_environment``; the files the flags name fill what the flags leave
(``arguments.parse_with_sources``). Each value takes the first of flag, environment, file, default
(``run_tree.SOURCES``, ``run_tree.first_given``); values the checks complete from others (the
data-parallel size from WORLD_SIZE, the micro-batches per step, ...) are marked "derived".
"""
from __future__ import annotations

import sys
from dataclasses import fields
from typing import Any, Mapping, Optional, Sequence

from megatron.quant.settings.environment import read_environment
from megatron.quant.training.arguments import parse_with_sources, validate_args
from megatron.quant.training.run_tree import SECTIONS, QuantSection, RunTree, first_given, quant_variable

DERIVED = "derived from the values above"


def _quant_section(settings: Mapping[str, str]) -> tuple[QuantSection, dict[str, str]]:
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for item in fields(QuantSection):
        name = quant_variable(item.name)
        given = {name: settings[name]} if settings.get(name, "").strip() else {}
        values[item.name], source = first_given(name, [("environment", given), ("default", {name: None})])
        sources[f"quant.{item.name}"] = f"environment {name}" if source == "environment" else source
    return QuantSection(**values), sources


def build_run_tree(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None, *,
                   cuda: bool) -> RunTree:
    """The run's configuration from ``argv`` (None: this process's command line) and ``environ`` (None:
    this process's environment); ArgumentError/ValueError with a one-line reason for a bad value."""
    argv = sys.argv[1:] if argv is None else list(argv)
    environment = read_environment(environ)
    args, flag_sources = parse_with_sources(argv)
    parsed = dict(vars(args))
    args = validate_args(args, environment.world_size, cuda)
    values = vars(args)
    sources: dict[str, str] = {}
    sections: dict[str, Any] = {}
    for name, section in SECTIONS.items():
        keys = [item.name for item in fields(section)]
        sections[name] = section(**{key: values[key] for key in keys})
        for key in keys:
            given = flag_sources.get(key, "")
            changed = key not in parsed or parsed[key] != values[key]
            if changed:  # completed from other values, or a flag the checks adjusted (with a notice)
                given = f"{given}, adjusted (see the notices)" if given.startswith("flag") else DERIVED
            sources[f"{name}.{key}"] = given
    quant, quant_sources = _quant_section(environment.settings)
    sources.update(quant_sources)
    sources["parallel.data_parallel_size"] = "derived from WORLD_SIZE and the parallel sizes"
    return RunTree(**sections, quant=quant, environment=environment, notices=tuple(args.notices), sources=sources)
