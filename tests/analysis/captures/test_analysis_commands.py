"""End to end: each command on a tiny run's captures writes every listed output, every PNG is
a valid image and every link and image of index.html resolves."""
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest
from capture_fixture import FAST
from PIL import Image

REPO = Path(__file__).resolve().parents[3]
QUANT_TYPES = ("bf16", "hifp8", "mxfp4", "mxfp8")
QUICK = {"quick_analysis.png", "tensor_stats.txt"}
BASIC = {"distributions", "heatmaps", "comparisons", "statistics", "attention_analysis"}
ENHANCED = {"quantization_analysis", "layer_analysis", "overflow_analysis", "fp8_analysis",
            "bf16_analysis", "backward_analysis", "rank_analysis", "exponent_analysis",
            "training_trends"}
# Figures the issue names explicitly, for this fixture's data.
NAMED_FIGURES = (
    [f"exponent_analysis/{qt}.png" for qt in QUANT_TYPES]
    + [f"training_trends/{qt}.png" for qt in QUANT_TYPES]
    + [f"layer_analysis/layer_trends_{qt}.png" for qt in ("hifp8", "mxfp4", "mxfp8")]
    + [f"fp8_analysis/hifp8_vs_mxfp8_{name}.png"
       for name in ("distributions", "statistics", "correlation", "normal_fit")]
    + ["bf16_analysis/bf16_distributions.png", "bf16_analysis/bf16_moments.png",
       "overflow_analysis/overflow_overview.png", "backward_analysis/forward_vs_backward.png",
       "rank_analysis/rank_statistics.png", "attention_analysis/attention_maps.png",
       "statistics/tensor_summary.csv"]
    + [f"distributions/{qt}_{lt}_{op}.png" for qt in QUANT_TYPES
       for lt in ("linear", "attention") for op in ("forward", "backward")])


def _run(command: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def one_click(tiny_logs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one_click") / "draw"
    _run(["bash", "script/one_click_visualize.sh", str(tiny_logs), str(out), *FAST])
    return out


@pytest.fixture(scope="module")
def three_scripts(tiny_logs, tmp_path_factory) -> dict[str, set[str]]:
    """The three scripts one after the other into one directory, on the two FP8 quant types
    only (half the figures, and bf16 absent); what each added."""
    out = tmp_path_factory.mktemp("scripts") / "draw"
    added = {}
    for script in ("script/quick_visualize.py", "script/visualize_tensors.py",
                   "script/visualization/enhanced_tensor_visualizer.py"):
        before = _tree(out)
        _run([sys.executable, script, "--tensor_dir", str(tiny_logs), "--output_dir", str(out),
              "--quant_types", "hifp8", "mxfp8", *FAST])
        added[script] = _tree(out) - before
    added["out"] = out
    return added


def _tree(root: Path) -> set[str]:
    if not root.exists():
        return set()
    return {str(p.relative_to(root)) for p in root.rglob("*") if ".report" not in p.parts}


def test_one_click_writes_every_output(one_click):
    tree = _tree(one_click)
    assert QUICK | BASIC | ENHANCED | {"index.html"} <= tree
    for folder in BASIC | ENHANCED:
        assert any(p.startswith(f"{folder}/") and p.endswith(".png") for p in tree), folder
    missing = [name for name in NAMED_FIGURES if name not in tree]
    assert not missing


def test_each_script_writes_its_outputs(three_scripts, one_click):
    quick, basic, enhanced = (three_scripts[s] for s in (
        "script/quick_visualize.py", "script/visualize_tensors.py",
        "script/visualization/enhanced_tensor_visualizer.py"))
    assert QUICK | {"index.html"} <= quick
    assert BASIC <= basic and not (ENHANCED & basic)
    assert ENHANCED <= enhanced and not (BASIC & enhanced)
    # What the filtered scripts draw, the one-click command (all quant types) draws too.
    pngs = {p for p in _tree(three_scripts["out"]) if p.endswith(".png")}
    assert pngs < {p for p in _tree(one_click) if p.endswith(".png")}
    assert not any("bf16" in p or "mxfp4" in p for p in pngs)


def test_missing_data_leaves_a_note_instead_of_a_figure(three_scripts):
    out = three_scripts["out"]
    assert not list((out / "bf16_analysis").glob("*.png"))
    note = (out / "bf16_analysis" / "NOTES.txt").read_text()
    assert "no bf16 captures" in note and "hifp8, mxfp8" in note
    page = (out / "index.html").read_text()
    # one line of the page's short "Not drawn" list, not a section of its own
    assert "<li><b>BF16 baseline</b>: no bf16 captures" in page and "<h2 id='bf16'>" not in page


@pytest.mark.parametrize("which", ["one_click", "three_scripts"])
def test_every_png_is_a_valid_image(which, request):
    out = request.getfixturevalue(which)
    out = out["out"] if isinstance(out, dict) else out
    pngs = sorted(out.rglob("*.png"))
    assert len(pngs) > 40
    for path in pngs:
        with Image.open(path) as image:
            image.verify()
            assert image.format == "PNG" and min(image.size) > 100, path


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.targets = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if (tag, name) in (("a", "href"), ("img", "src")) and not value.startswith("#"):
                self.targets.append(value)


@pytest.mark.parametrize("which", ["one_click", "three_scripts"])
def test_index_links_resolve_and_show_every_figure(which, request):
    out = request.getfixturevalue(which)
    out = out["out"] if isinstance(out, dict) else out
    parser = _Links()
    parser.feed((out / "index.html").read_text(encoding="utf-8"))
    targets = {unquote(t) for t in parser.targets}
    assert all("://" not in t and not t.startswith("/") for t in targets)  # relative only
    assert all((out / t).is_file() for t in targets), [t for t in targets if not (out / t).is_file()]
    figures = {str(p.relative_to(out)) for p in out.rglob("*.png")}
    assert figures <= targets


def test_every_section_of_a_dense_runs_report_draws(one_click):
    """On captures shaped like the quickstart's (four formats, two ranks, statistics over iterations, what-if
    and per-block statistics) no section is "Not drawn", none is about experts (a dense model has none) and
    no figure breaks its budget."""
    page = (one_click / "index.html").read_text()
    assert "id='not-drawn'" not in page and "Mixture of experts" not in page
    assert "Warning: figure" not in page
