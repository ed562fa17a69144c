"""README.md and the guides in docs/ stay navigable: every relative link and anchor resolves."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


# Words of a workplace the user does not have: a user has a GPU node, a cluster job with a time limit, or a laptop.
WORKPLACE_PHRASES = ("GPU session", "for a session", "GPU call", "calls of 10 minutes", "GPU minutes",
                     "borrowed machine", "the GPU machine", "this machine", "device budget", "$OUT")
USER_FILES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "docs/study").glob("*.yaml")),
              *sorted(p for p in (REPO / "examples").rglob("*") if p.is_file()),
              *sorted(p for p in (REPO / "script").rglob("*") if p.suffix in (".py", ".sh"))]


def workplace_words(text: str) -> list[str]:
    """The forbidden phrases in ``text``, read across line breaks and comment markers."""
    flat = re.sub(r"\s*\n\s*(?:#+\s+)?", " ", text)
    return [phrase for phrase in WORKPLACE_PHRASES
            if (phrase in flat if phrase.startswith("$") else phrase.lower() in flat.lower())]


def test_workplace_words_are_found():
    assert workplace_words("sized for GPU calls of 10\n# minutes on the GPU\nmachine, --out $OUT") == [
        "GPU call", "calls of 10 minutes", "the GPU machine", "$OUT"]
    assert workplace_words("a job of 10 minutes on your GPU; out=$out; a capture session") == []


@pytest.mark.parametrize("page", USER_FILES, ids=lambda page: str(page.relative_to(REPO)))
def test_user_files_speak_of_the_users_machines(page):
    found = workplace_words(page.read_text(errors="replace"))
    assert not found, f"{page.relative_to(REPO)} speaks of a workplace the user does not have: {found}"


def test_recipes_show_reads_the_example_precision_files(capsys):
    """``python -m megatron.quant.recipes show FILE`` on a per-module precision file (docs/recipes.md)
    shows its matchers and each config's operands, not a recipe file's error."""
    from megatron.quant.recipes import cli

    assert cli.main(["show", str(REPO / "examples" / "precision" / "te-mixed.yaml"), "--num-layers", "2"]) == 0
    shown = capsys.readouterr().out
    assert "GlobMatcher(pattern=*linear_fc1, config_key=nvfp4)" in shown
    assert "config nvfp4:\nrecipe te-nvfp4" in shown and "config bf16:" in shown


def test_the_capture_guides_python_example_runs(tmp_path):
    """docs/capture.md's Python API example is complete: it imports what it uses and writes a manifest."""
    guide = (REPO / "docs" / "capture.md").read_text()
    section = guide[guide.index("## Python API"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"^30 quant/fc1/input/sqnr_db [\d.]+$", done.stdout, re.M)
    assert len((tmp_path / "my_stats" / "mxfp8" / "manifest-rank00.jsonl").read_text().splitlines()) == 6


@pytest.mark.parametrize("train_iters", [24, 100_000])  # the quickstart's run and a long one
def test_the_schedule_example_runs_at_any_length(train_iters):
    """docs/recipes.md's scheduled recipe, copied as is, is accepted whatever --train-iters is."""
    from megatron.quant.recipes.precision import PrecisionConfig
    from megatron.quant.recipes.recipe import QuantRecipe

    guide = (REPO / "docs" / "recipes.md").read_text()
    section = guide[guide.index("## Scheduled recipes"):]
    example = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    precision = PrecisionConfig.uniform(QuantRecipe.from_dict(example, source="docs/recipes.md"))
    assert len(precision.for_run(train_iters, num_layers=2).schedules()) == 1
