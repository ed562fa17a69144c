"""The run configuration is the only reader of a run's command line and environment.

Parses every module of the package (and the scripts and examples) and refuses ``getattr(args, ...)``
(a flag found by its string) and any read of ``os.environ``, ``os.getenv`` or ``sys.argv`` outside
the modules that build the configuration.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "megatron" / "quant"
# The one reader of os.environ (settings.environment) and of a training run's sys.argv (the builder).
READERS = {"megatron/quant/settings/environment.py": {"os.environ"},
           "megatron/quant/training/run_tree_build.py": {"sys.argv"}}
# Other programs' own command lines: the report commands read theirs and are no training run.
OTHER_PROGRAMS = {"megatron/quant/analysis/cli.py": {"sys.argv"},
                  "megatron/quant/analysis/runs/report.py": {"sys.argv"},
                  "megatron/quant/analysis/captures/pipeline.py": {"sys.argv"}}  # the command recorded in a report
_FORBIDDEN = {("os", "environ"): "os.environ", ("os", "environb"): "os.environ", ("os", "getenv"): "os.getenv",
              ("os", "putenv"): "os.environ", ("sys", "argv"): "sys.argv"}


def forbidden_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) for each ``getattr(args, ...)`` and each use of os.environ/os.getenv/sys.argv in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "args":
            found.append((node.lineno, "getattr(args, ...)"))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and (node.value.id, node.attr) in _FORBIDDEN:
            found.append((node.lineno, _FORBIDDEN[node.value.id, node.attr]))
        elif isinstance(node, ast.ImportFrom) and node.module in ("os", "sys"):
            found += [(node.lineno, _FORBIDDEN[node.module, alias.name]) for alias in node.names
                      if (node.module, alias.name) in _FORBIDDEN]
    return sorted(found)


def _sources():
    for folder in (PACKAGE, ROOT / "script", ROOT / "examples"):
        yield from sorted(folder.rglob("*.py"))


def test_the_checker_finds_each_kind_of_read():
    source = ("import os, sys\nfrom os import getenv\nx = getattr(args, 'lr')\ny = os.environ.get('A')\n"
              "z = os.getenv('B')\nw = sys.argv[1:]\nv = getattr(tree, 'lr')\n")
    assert forbidden_reads(source) == [(2, "os.getenv"), (3, "getattr(args, ...)"), (4, "os.environ"),
                                       (5, "os.getenv"), (6, "sys.argv")]


def test_only_the_configuration_reads_the_command_line_and_the_environment():
    allowed = {path: READERS.get(path, set()) | OTHER_PROGRAMS.get(path, set())
               for path in {*READERS, *OTHER_PROGRAMS}}
    bad = [f"{path}:{line}: {what}" for file in _sources() for path in [file.relative_to(ROOT).as_posix()]
           for line, what in forbidden_reads(file.read_text(encoding="utf-8"))
           if what not in allowed.get(path, set())]
    assert not bad, "read it through the run configuration (training/run_tree_build.py, settings/environment.py):\n" \
        + "\n".join(bad)


def test_every_allowed_reader_still_reads():
    """An allow-list entry that no longer reads anything is removed, not kept."""
    for path, kinds in {**READERS, **OTHER_PROGRAMS}.items():
        found = {what for _, what in forbidden_reads((ROOT / path).read_text(encoding="utf-8"))}
        assert kinds <= found, f"{path} no longer reads {kinds - found}: drop it from the allow-list"
