"""README.md and the guides in docs/ stay navigable: every relative link and anchor resolves."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)|<img\s[^>]*src=\"([^\"]+)\"")
HEADING = re.compile(r"#{1,6}\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks (``# comment`` in a bash block is no heading)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug_anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lowercase, only letters, digits, spaces, '-' and '_' kept,
    spaces to hyphens; a repeated heading gets -1, -2, ..."""
    anchors, seen = set(), {}
    for line in _prose(text):
        match = HEADING.match(line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """'page: target (why)' for every relative link of ``page`` that does not resolve."""
    broken = []
    for line in _prose(page.read_text()):
        for match in LINK.finditer(line):
            target = match.group(1) or match.group(2)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}: {target}"
            if not file.is_file():
                broken.append(f"{where} (no file {path})")
            elif anchor and file.suffix == ".md" and anchor not in slug_anchors(file.read_text()):
                broken.append(f"{where} (no heading #{anchor} in {file.relative_to(root)})")
    return broken


def test_slug_rule_matches_github():
    text = "# Numeric formats (`megatron.quant.formats`)\n```\n# not a heading\n```\n## Flags\n## Flags\n"
    assert slug_anchors(text) == {"numeric-formats-megatronquantformats", "flags", "flags-1"}
    assert slug_anchors("## Recipes: Megatron-LM's flags_x\n") == {"recipes-megatron-lms-flags_x"}


def test_broken_links_are_found(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n")
    page.write_text("# Top\n[a](#top) [b](other.md#other) [c](#nowhere) [d](other.md#gone) [e](missing.md)\n"
                    '<img src="missing.png"> [f](https://example.com/x)\n')
    assert [line.split(" (")[0] for line in broken_links(page, root=tmp_path)] == [
        "page.md: #nowhere", "page.md: other.md#gone", "page.md: missing.md", "page.md: missing.png"]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_and_anchor_resolves(page):
    broken = broken_links(page)
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_stays_short():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines < 260, f"README.md has {lines} lines; move details into a guide under docs/"
