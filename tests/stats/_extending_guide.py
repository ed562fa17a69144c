"""docs/extending.md's new element grid, followed: its lines registered for one test only."""
import re
from pathlib import Path

from megatron.quant.formats import grid, registry

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
GUIDE_FORMAT = "extending-guide-grid"  # a test parameter: the format the guide adds (the ``name`` fixture)


def guide_grid_steps() -> tuple[str, str]:
    """The guide's two lines for a new element grid: its declaration in grid.py and its registry line."""
    section = GUIDE.read_text().split("### A new element grid", 1)[1].split("\n#", 1)[0]
    grid_line, registry_line = (block.strip() for block in re.findall(r"```python\n(.*?)```", section, re.S)[:2])
    return grid_line, registry_line


def guide_format(monkeypatch) -> str:
    """Register the guide's new format by its own lines, undone with ``monkeypatch``; its name (a format
    the code has already, once someone adds it for real, is left as it is)."""
    grid_line, registry_line = guide_grid_steps()
    grid_name, element = (part.strip() for part in grid_line.split("=", 1))
    if not hasattr(grid, grid_name):
        monkeypatch.setattr(grid, grid_name, eval(element, vars(grid)), raising=False)  # noqa: S307
    (name, entry), = eval("{" + registry_line + "}", {**vars(registry), **vars(grid)}).items()  # noqa: S307
    if name not in registry._REGISTRY:
        monkeypatch.setitem(registry._REGISTRY, name, entry)
    return name
