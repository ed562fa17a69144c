"""The figure budget (analysis/figure_budget.py) holds for every figure family the package draws:
each capture-report analysis, the format comparison, the runs comparison and the layer I/O
differences, on the tiny capture the quickstart resembles and on a wide one (4 layers, every
tensor of every GEMM, five formats). One figure per family and drawing function (the one with the most data),
at a low dpi: the budget is measured in the figure's own units, so the dpi does not change it."""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from megatron.quant.analysis import figure_budget, figure_render, figures
from megatron.quant.analysis.captures import distributions, fp8
from megatron.quant.analysis.captures.families import ANALYSES
from megatron.quant.analysis.captures.loading import SummaryOptions
from megatron.quant.analysis.captures.pipeline import ReportOptions, analysis_input
from megatron.quant.analysis.plans import FigureJob, PlotSettings
from megatron.quant.analysis.runs import forest, metrics
from megatron.quant.analysis.runs import report as runs_report
from megatron.quant.analysis.runs.read import GRAD_NORM, LOSS, LR, TOKENS_PER_S, VALIDATION, Run
from megatron.quant.compare import whatif_report
from megatron.quant.compare.report import plot_difference_histograms

sys.path.insert(0, str(Path(__file__).parent))
from capture_fixture import ALL_MODULES, Capture, metadata, tiny_run, write_captures  # noqa: E402

DPI = 30
FIVE_FORMATS = ("hifp8", "mxfp8", "mxfp4", "nvfp4", "fp8_e4m3", "bf16")


@pytest.fixture(scope="module")
def wide_logs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wide_logs")
    tiny_run(root, quant_types=FIVE_FORMATS, layers=tuple(range(4)), ranks=(0,), stats_iterations=(1, 2),
             modules=ALL_MODULES)
    return root


def _widest(jobs: list[FigureJob]) -> list[FigureJob]:
    """One job per drawing function: the one with the largest payload."""
    chosen: dict = {}
    for job in jobs:
        size = len(pickle.dumps(job.payload))
        if job.draw not in chosen or size > chosen[job.draw][0]:
            chosen[job.draw] = (size, job)
    return [job for _, job in chosen.values()]


def _broken(jobs: list[FigureJob], out: Path) -> dict[str, str]:
    outcomes = {job.path: figure_render.render(job, out, DPI) for job in jobs}
    return {path: drawn.error or drawn.warning() for path, drawn in outcomes.items() if not drawn.clean}


@pytest.mark.parametrize("capture", ["tiny_logs", "wide_logs"])
def test_every_capture_report_family_keeps_the_budget(capture, request, tmp_path):
    options = ReportOptions(request.getfixturevalue(capture), tmp_path, ANALYSES, progress=False,
                            summary=SummaryOptions(sample_size=2_000),
                            settings=PlotSettings(figure_budget=10_000, max_panels=4))  # 4 panels show a grid's layout
    inp = analysis_input(options)
    jobs, not_drawn = [], []
    for analysis in ANALYSES:
        (tmp_path / analysis.folder).mkdir(parents=True, exist_ok=True)
        plan = analysis.build(inp)
        jobs += _widest(plan.figures)
        not_drawn += [analysis.key] if plan.notes and not plan.figures and not plan.files else []
    if capture == "tiny_logs":  # every family draws on it (the wide one has a single rank), as on the quickstart's
        # captures, but the experts figure, which needs an MoE run's captures (tests/analysis/captures/
        # test_experts_figure.py): a dense model's report has no experts section, not one "Not drawn"
        assert {job.path.split("/")[0] for job in jobs if "/" in job.path} >= {a.folder for a in ANALYSES
                                                                              if a.folder and a.key != "experts"}
        assert not_drawn == []
    assert _broken(jobs, tmp_path) == {}


def test_values_small_or_decades_apart_keep_the_budget(tmp_path):
    """A histogram of gradients of 1e-3 (tick labels such as '-0.0075' cramped), and the HiFP8 vs MXFP8 correlation of
    tensors 1e4 apart (a weight of 0.1 beside a gradient of 1e-5): the quickstart's captures drew both over
    budget."""
    rng = np.random.default_rng(0)
    grad = {name: np.clip(rng.normal(0, 3e-3, 3_000), -0.0099, 0.0099)
            for name in ("pre grad_output", "post grad_query", "post grad_key")}
    panels = [{"title": title, "x": x, "y": x * (1 + 0.01 * rng.standard_normal(x.size))}
              for title, x in (("fc1 fwd pre weight", rng.normal(0, 0.1, 2_000)),
                               ("attn bwd post grad_query", rng.normal(0, 1e-5, 2_000)),
                               ("fc1 fwd pre input", rng.normal(0, 1.0, 2_000)))]
    jobs = [FigureJob("distributions/gradients.png", "", distributions.draw_distribution,
                      {"title": "mxfp8: attention backward tensors", "series": grad}),
            FigureJob("fp8_analysis/correlation.png", "", fp8.draw_correlation, {"panels": panels})]
    for folder in ("distributions", "fp8_analysis"):
        (tmp_path / folder).mkdir()
    assert _broken(jobs, tmp_path) == {}


def _whatif_rows(classes: int, layers: int) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for cls in range(classes):
        for layer in range(layers):
            for name in FIVE_FORMATS[:5]:
                rows.append({"role": f"role{cls % 7}", "operation": "forward" if cls % 2 else "backward",
                             "tensor_name": f"tensor_{cls}", "operand": "", "format": name, "layer_idx": layer,
                             "sqnr_db": float(rng.uniform(5, 40)), "relative_error": float(rng.uniform(0.01, 0.5)),
                             "overflow_ratio": 0.0, "underflow_ratio": float(rng.uniform(0, 1e-3))})
    return rows


@pytest.mark.parametrize("classes,layers", [(10, 2), (16, 4)])
def test_the_format_comparison_keeps_the_budget(classes, layers, tmp_path):
    jobs = whatif_report.figure_jobs(_whatif_rows(classes, layers))
    assert [Path(job.path).name for job in jobs] == ["by_class.png", "by_layer.png"]
    assert _broken(jobs, tmp_path) == {}


def _study(recipes: int) -> list[Run]:
    """``recipes`` recipes x 3 seeds of 60 logged iterations, in memory, with stats-mode tags."""
    rng = np.random.default_rng(0)
    steps = np.arange(1, 61)
    runs = []
    for i in range(recipes):
        name = "bf16" if i == 0 else f"recipe-{i}-with-a-long-name"
        for seed in ("", "-seed1", "-seed2"):
            loss = (2 + 4 * np.exp(-steps / 20)) * (1 + 0.002 * i + 0.01 * rng.standard_normal(steps.size))
            scalars = {LOSS: (steps, loss), GRAD_NORM: (steps, 1 + rng.random(steps.size)),
                       LR: (steps, np.full(steps.size, 1e-3)), TOKENS_PER_S: (steps, 1e4 + rng.random(steps.size)),
                       VALIDATION: (steps[::20], loss[::20]),
                       **{f"train/quant/{site}/sqnr_db": (steps, 20 + rng.random(steps.size))
                          for site in ("qkv/input", "fc1/input", "fc2/weight", "proj/grad_output")}}
            runs.append(Run(name + seed, scalars))
    return runs


@pytest.mark.parametrize("recipes", [3, 12])
def test_the_runs_comparison_keeps_the_budget(recipes, tmp_path):
    runs = _study(recipes)
    baseline = runs[0]
    groups = metrics.recipe_groups(runs)
    curves = [run for run in runs if run.seed_of is None]
    band = metrics.noise_band(baseline, [run for run in runs if run.seed_of == "bf16"], 0.6)
    jobs = runs_report.all_figure_jobs(curves, baseline, 0.6, band, groups, metrics.recipe_table(groups, "bf16"))
    assert {"loss.png", forest.NAME, "loss_bands.png", "training.png", "validation.png"} <= {j.path for j in jobs}
    assert any(job.path.startswith("stats_") for job in jobs)
    assert _broken(_widest(jobs), tmp_path) == {}


def test_a_short_sweeps_stats_keep_the_budget(tmp_path):
    """Two recipes, stats captured twice: values that differ in the 4th digit, sites a decade
    apart, a metric that is zero everywhere (what a 2-recipe CPU sweep logs)."""
    rng = np.random.default_rng(1)
    steps, stats_steps = np.arange(1, 16), np.array([1, 11])
    sites = [f"{role}/{operand}" for role in ("qkv", "proj", "fc1", "fc2")
             for operand in ("input", "weight", "grad_output")]
    runs = [Run(name, {LOSS: (steps, 5 - 0.05 * steps + 0.01 * rng.random(steps.size)),
                       TOKENS_PER_S: (steps, 1e3 + 50 * rng.random(steps.size)),
                       **{f"train/quant/{site}/rel_mse": (stats_steps,
                                                          (1 + 9 * (i % 2)) * (8.5e-4 + 1e-6 * rng.random(2)))
                          for i, site in enumerate(sites)},
                       **{f"train/quant/{site}/overflow_ratio": (stats_steps, np.zeros(2)) for site in sites}})
            for name in ("bf16", "mxfp8")]
    jobs = runs_report.all_figure_jobs(runs, runs[0], 0.6, None, metrics.recipe_groups(runs), [])
    assert {"stats_rel_mse.png", "stats_overflow_ratio.png"} <= {job.path for job in jobs}
    assert _broken(jobs, tmp_path) == {}


def test_the_study_forest_plot_draws_from_the_committed_table(tmp_path):
    """docs/study holds the study's tables, not its runs: the README's figure comes from the CSV."""
    table = Path(__file__).parents[2] / "docs" / "study" / "study_150_recipes.csv"
    assert forest.draw_from_csv(table, tmp_path / "forest.png", dpi=DPI).clean
    assert (tmp_path / "forest.png").is_file()


def test_layer_io_differences_keep_the_budget(tmp_path):
    rng = np.random.default_rng(0)
    reference = rng.standard_normal(512).astype(np.float32)
    results = {mode: {"input": reference + scale * rng.standard_normal(512).astype(np.float32)}  # errors 40x apart
               for mode, scale in {"bf16": 0, "hifp8": 1e-3, "mxfp8": 2e-3, "mxfp4": 4e-2, "nvfp4": 3e-2}.items()}
    [(path, drawn)] = plot_difference_histograms(results, "bf16", tmp_path / "io")
    assert path.is_file() and drawn.clean, drawn


def _figure(draw) -> Figure:
    fig, [ax] = figures.subplot_grid(1, ncols=1, panel_size=(4.0, 3.0))
    draw(ax)
    fig.canvas.draw()
    return fig


def test_the_budget_names_what_a_reader_cannot_see():
    crowded = _figure(lambda ax: [ax.plot([0, 1], [i, i + 1], label=f"series {i}") for i in range(12)])
    assert any("12 series in one panel" in p for p in figure_budget.problems(crowded))
    covered = _figure(lambda ax: (ax.plot(np.linspace(0, 1, 50), np.linspace(0, 1, 50), label="a"),
                                  ax.legend(loc="center")))
    assert any("legend covers data points" in p for p in figure_budget.problems(covered))
    dense = _figure(lambda ax: ax.set_xticks(range(40), [f"tensor class {i}" for i in range(40)], rotation=30))
    assert any("x tick labels" in p and "overlap" in p for p in figure_budget.problems(dense))
    clipped = _figure(lambda ax: ax.set_ylabel("a label\n" * 30))
    assert any("runs off the figure" in p for p in figure_budget.problems(clipped))
    single = _figure(lambda ax: ax.plot([3], [0.5], "o"))
    assert any("a single data point" in p for p in figure_budget.problems(single))
    zeros = _figure(lambda ax: ax.scatter([1, 2, 3], [0, 0, 0]))
    assert any("its data are constant" in p for p in figure_budget.problems(zeros))
    zoomed = _figure(lambda ax: ax.plot([1, 11], [8.544e-4, 8.556e-4]))
    assert any("the y axis spans" in p for p in figure_budget.problems(zoomed))
    fig, axes = figures.subplot_grid(2, ncols=2, panel_size=(4.0, 3.0))
    for ax, scale in zip(axes, (1.0, 40.0)):
        ax.hist(scale * np.random.default_rng(0).standard_normal(200), bins=20)
        ax.set_xlabel("difference")
    fig.canvas.draw()
    assert any("on scales" in p and "apart" in p for p in figure_budget.problems(fig))
    clean = _figure(lambda ax: (ax.plot([0, 1], [0, 1], label="a"), figures.legend_above(ax)))
    assert figure_budget.problems(clean) == []


def test_the_budget_names_panels_that_say_nothing_or_hide_it():
    zero_bars = _figure(lambda ax: ax.bar(["qkv", "fc1", "fc2"], [0.0, 0.0, 0.0]))
    assert any("bars are all of one height" in p for p in figure_budget.problems(zero_bars))
    zero_series = _figure(lambda ax: [ax.bar([0, 1], heights, label=name)
                                      for name, heights in (("overflow", [0, 0]), ("underflow", [0.5, 0.7]))])
    assert any("'overflow' is zero everywhere" in p for p in figure_budget.problems(zero_series))
    flat = _figure(lambda ax: [ax.plot([0, 1], [level, level + 0.01], label=f"format {level}") for level in (18, 25)])
    assert any("2 series are all flat along x" in p for p in figure_budget.problems(flat))
    hidden = _figure(lambda ax: [ax.plot([0, 1, 2], [1, 3, 2], label=name) for name in ("mxfp8", "fp8_e4m3")])
    assert any("'fp8_e4m3' is hidden under 'mxfp8'" in p for p in figure_budget.problems(hidden))
    fig, [ax] = figures.subplot_grid(1, ncols=1, panel_size=(24.0, 3.0))  # shrunk to half on the page
    ax.plot([0, 1], [0, 1])
    ax.text(0.5, 0.5, "0.123", fontsize=10)
    fig.canvas.draw()
    assert any("reads at 5.0 pt" in p for p in figure_budget.problems(fig))
    fraction = _figure(lambda ax: (ax.plot([0, 1], [0, 1e-3]), ax.set_ylabel("underflow ratio")))
    assert any("'underflow ratio' is a share of elements drawn without %" in p
               for p in figure_budget.problems(fraction))
    kept = _figure(lambda ax: ([ax.plot([0, 1, 2], [1, 3 + i, 2], label=f"s{i}") for i in range(2)],
                               ax.bar([3, 4], [1, 2]), ax.text(1, 1, "note", fontsize=8),
                               ax.set_ylabel("underflow (% of elements)"), figures.legend_above(ax)))
    assert figure_budget.problems(kept) == []


def test_a_capture_of_nan_inf_zeros_and_1e30_draws_within_the_budget(tmp_path):
    """Non-finite values, zeros and 1e30 beside values of 1: every figure informs (magnitudes as log2
    histograms, a few or repeated values drawn as they are), none breaks the budget."""
    import torch

    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, 1e30, -1e30, 0.0, 1.0] * 64).reshape(16, 32)
    weight = torch.where(torch.rand(16, 32, generator=torch.Generator().manual_seed(0)) < 0.1,
                         torch.tensor(float("inf")), torch.randn(16, 32, generator=torch.Generator().manual_seed(1)))
    write_captures(tmp_path / "logs", [
        Capture(metadata(quant_type="hifp8", layer_type="linear", layer_idx=0, operation="forward", phase="pre",
                         tensor_name=name, role="qkv", iteration=1, shape=x.shape, counter=i), tensor)
        for i, (name, tensor) in enumerate((("input", x), ("weight", weight)))])
    chosen = [a for a in ANALYSES if a.key in ("distributions", "statistics")]
    inp = analysis_input(ReportOptions(tmp_path / "logs", tmp_path, chosen, progress=False,
                                       summary=SummaryOptions(sample_size=2_000)))
    jobs = []
    for analysis in chosen:
        (tmp_path / analysis.folder).mkdir(parents=True, exist_ok=True)
        jobs += analysis.build(inp).figures
    assert any(job.path.startswith("distributions/") for job in jobs)
    assert _broken(jobs, tmp_path) == {}
