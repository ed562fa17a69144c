"""Every Megatron-LM flag has an answer: honoured, accepted and ignored (a notice at start), or refused.

The answers are ``megatron_lm_flag_table.TABLE``. The trainer's parser defines the honoured flags
itself; ``add_answered_flags`` adds the others so that a Megatron-LM launch line parses, and
``take_answered`` turns those given into one-line notices, or the one-line refusal of the first
refused one. ``render_markdown`` writes the table for docs/training.md.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from megatron.quant.training.megatron_lm_flag_table import MEGATRON_LM_RELEASE, TABLE

KINDS = ("honoured", "ignored", "refused")
CONCERNS = ("model", "mixture of experts", "precision", "parallelism", "speed and memory",
            "optimizer and learning rate", "batch and run length", "data and tokenizer", "checkpoints",
            "logging and profiling", "validation", "cluster and fault tolerance", "other programs")
_DEST = "megatron_lm "  # a prefix no flag's own dest can have (it holds a space)


@dataclass(frozen=True)
class FlagAnswer:
    flag: str
    kind: str  # one of KINDS
    concern: str  # one of CONCERNS
    text: str  # honoured: its meaning; ignored: why; refused: what to use instead
    nargs: str  # Megatron-LM's arity: "" (a switch), "1", "+", "*", "?" or a count


def _parse(table: str) -> dict[str, FlagAnswer]:
    answers: dict[str, FlagAnswer] = {}
    blocks: list[list] = []  # [kind, concern, text, flag tokens]
    for line in table.splitlines():
        if line.startswith("--"):
            blocks[-1][3].append(line)
        elif line.startswith("    "):
            blocks[-1][2] += " " + line.strip()
        else:
            kind, concern, text = (part.strip() for part in line.split("|", 2))
            if kind not in KINDS or concern not in CONCERNS:
                raise ValueError(f"megatron_lm_flag_table: bad block header {line!r}")
            blocks.append([kind, concern, text, []])
    for kind, concern, text, lines in blocks:
        items = ([line.split(" ", 1) for line in lines] if kind == "honoured"
                 else [[token, text] for line in lines for token in line.split()])
        for token, meaning in items:
            flag, takes, nargs = token.partition("=")
            if flag in answers:
                raise ValueError(f"megatron_lm_flag_table: {flag} answered twice")
            answers[flag] = FlagAnswer(flag, kind, concern, meaning, (nargs or "1") if takes else "")
    return answers


ANSWERS: Mapping[str, FlagAnswer] = MappingProxyType(_parse(TABLE))


def add_answered_flags(parser: argparse.ArgumentParser) -> None:
    """The ignored and refused flags, parsed as Megatron-LM parses them (absent unless given; no --help line)."""
    for answer in ANSWERS.values():
        if answer.kind == "honoured":
            continue
        options = dict(dest=_DEST + answer.flag, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        if answer.nargs == "":
            parser.add_argument(answer.flag, action="store_true", **options)
        else:
            nargs = None if answer.nargs == "1" else int(answer.nargs) if answer.nargs.isdigit() else answer.nargs
            parser.add_argument(answer.flag, nargs=nargs, **options)


def take_answered(args: argparse.Namespace) -> list[str]:
    """Remove the ignored and refused flags from ``args``; the notices for those ignored, in command-line
    order. ValueError (one line: the flag and what to use) for the first refused one."""
    given = [key[len(_DEST):] for key in vars(args) if key.startswith(_DEST)]
    for flag in given:
        delattr(args, _DEST + flag)
    for flag in given:
        if ANSWERS[flag].kind == "refused":
            raise ValueError(f"{flag} (Megatron-LM) is refused: {ANSWERS[flag].text}")
    return [f"{flag} (Megatron-LM) ignored: {ANSWERS[flag].text}" for flag in given]


def render_markdown() -> str:
    """docs/training.md's flag table: per concern, the honoured flags one a row, the others by shared answer."""
    lines = [f"Read from Megatron-LM {MEGATRON_LM_RELEASE}, `megatron/training/arguments.py`: "
             f"{len(ANSWERS)} flags, {sum(a.kind == 'honoured' for a in ANSWERS.values())} honoured.", ""]
    for concern in CONCERNS:
        rows: dict[tuple[str, str], list[str]] = {}
        for answer in ANSWERS.values():
            if answer.concern == concern:
                key = (answer.kind, answer.text) if answer.kind != "honoured" else (answer.kind, answer.flag)
                rows.setdefault(key, []).append(answer.flag)
        if not rows:
            continue
        lines += [f"**{concern.capitalize()}**", "", "| Flags | Answer |", "|---|---|"]
        for kind in KINDS:
            for (row_kind, key), flags in rows.items():
                if row_kind != kind:
                    continue
                text = ANSWERS[flags[0]].text
                answer = text if kind == "honoured" else f"{kind}: {text}"
                lines.append(f"| {' '.join(f'`{flag}`' for flag in flags)} | {answer.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":  # docs/training.md's table: python -m megatron.quant.training.megatron_lm_flags
    print(render_markdown(), end="")
