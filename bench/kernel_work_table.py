"""The kernels' work model as a markdown table, from ``python -m bench.gpu.kernel_build --cubin --json PATH``:
one row per format and kernel class (``bench.gpu.work_model``), for fp32 and bf16 inputs the bytes a
processed element moves and the largest SASS instruction count an element among the class's
specializations, with its budget; a count over its budget is marked.

    python bench/kernel_work_table.py bench/results/kernel_work_sm90_triton3.6.json
"""
import argparse
import json
import sys
from pathlib import Path

DTYPES = ("float32", "bfloat16")


def cell(rows: list[dict]) -> str:
    """The heaviest of ``rows`` (instructions an element against its budget)."""
    if not rows:
        return "-"
    top = max(rows, key=lambda row: row["instructions_per_element"])
    over = " **over**" if top["over_budget"] else ""
    return f"{top['bytes_per_element']:g} B, {top['instructions_per_element']:g} ({top['budget_per_element']:g}){over}"


def table(rows: list[dict]) -> list[str]:
    """Markdown lines: a row per (format, class), in the order the build met them."""
    groups: dict[tuple[str, str], dict[str, list[dict]]] = {}
    for row in rows:
        if "error" in row or row["class"] is None:  # failed, or no work model (the accumulation model's GEMM)
            continue
        words = row["first_launched_by"].split()  # "FORMAT DTYPE ..." or "amax history ALGO DTYPE"
        dtype = next(word for word in words if word in DTYPES)
        fmt = " ".join(words[:words.index(dtype)])
        groups.setdefault((fmt, row["class"]), {name: [] for name in DTYPES})[dtype].append(row)
    lines = ["| format | class | fp32 input: bytes, instructions an element (budget) | bf16 input | "
             "specializations over budget |", "|---|---|---|---|---|"]
    for (fmt, klass), by_dtype in groups.items():
        members = [row for found in by_dtype.values() for row in found]
        over = sum(row["over_budget"] for row in members)
        lines.append(f"| {fmt} | {klass} | {cell(by_dtype['float32'])} | {cell(by_dtype['bfloat16'])} | "
                     f"{over} of {len(members)} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", type=Path, help="kernel_build --cubin's JSON")
    args = parser.parse_args(argv)
    data = json.loads(args.json.read_text())
    if not data.get("cubin") or not all("class" in row for row in data["rows"] if "error" not in row):
        print(f"{args.json}: not a --cubin build with the work model (run python -m bench.gpu.kernel_build --cubin "
              f"--json PATH)")
        return 2
    rows = [row for row in data["rows"] if "error" not in row and row["class"] is not None]
    over = sum(row["over_budget"] for row in rows)
    print(f"Triton {data['triton']}, {data['target']}: {len(rows)} specializations, {over} over budget\n")
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
