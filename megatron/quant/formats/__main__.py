"""Print the formats and their representable values.

    python -m megatron.quant.formats list            # every format: bits, range, block, scaling, options
    python -m megatron.quant.formats values hifp8    # all 256 codes with their values
    python -m megatron.quant.formats values mxfp4    # the element codes of a block format
"""
from __future__ import annotations

import argparse
import sys

from .registry import ALIASES, format_options, get_format, list_formats


def _format_table() -> list[str]:
    aliases = {canonical: [] for canonical in list_formats()}
    for alias, canonical in ALIASES.items():
        aliases[canonical].append(alias)
    header = f"{'name':<12} {'bits':>4} {'max':>12} {'min positive':>13} {'block':>5}  {'scaling':<7} aliases"
    lines = [header, "-" * len(header)]
    for name in list_formats():
        fmt = get_format(name)
        lines.append(f"{name:<12} {fmt.bits:>4} {fmt.max_value:>12.6g} {fmt.min_positive:>13.6g} "
                     f"{fmt.block_size or '-':>5}  {fmt.scaling:<7} {', '.join(aliases[name]) or '-'}")
    lines += ["", "options: name=default (allowed values); '-': no default or one set by the scaling "
                  "(see docs/formats.md)"]
    for name in list_formats():
        described = [f"{key}={'-' if spec.default is None else spec.default} ({spec.describe()})"
                     for key, spec in format_options(name).items()]
        lines.append(f"{name:<12} {', '.join(described) or '-'}")
    return lines


def _value_table(name: str) -> list[str]:
    fmt = get_format(name)
    element = fmt.element
    if element is None:
        raise ValueError(f"{fmt.name} has {2 ** fmt.bits} codes; values are listed for the 8-bit and smaller formats")
    lines = [f"# {fmt.name}: element {element.name}, {element.bits} bits, max {element.max_value:g}, "
             f"min positive {element.min_positive:g}"]
    if fmt.block_size:
        lines.append(f"# blocks of {fmt.block_size} elements; scale: {fmt.scale_encoding}")
    lines.append(f"{'code':>4} {'hex':>4} {'bits':>{element.bits}} value")
    for code, value in element.code_values():
        lines.append(f"{code:>4} {code:#04x} {code:0{element.bits}b} {value!r}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m megatron.quant.formats", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="every format with its bits, range, block size and scaling")
    values = commands.add_parser("values", help="every code of a format's element and its value")
    values.add_argument("name", help="format name or alias, e.g. hifp8, fp8_e4m3, mxfp4, nvfp4")
    args = parser.parse_args(argv)
    try:
        lines = _format_table() if args.command == "list" else _value_table(args.name)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
