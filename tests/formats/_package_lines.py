"""The package's source lines that match a pattern, as "path:line: text" (for the tests that hold a rule
of the format interface over every module)."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def package_lines_matching(pattern: str) -> list[str]:
    found = re.compile(pattern)
    return [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for path in sorted((ROOT / "megatron" / "quant").rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), 1) if found.search(line)]
