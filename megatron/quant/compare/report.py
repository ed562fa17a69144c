"""Layer I/O results: .npz and _stats.json files, the per-mode screen report, difference histograms.

Results are ``{mode: {tensor_name: array}}``. A tensor name is ``input``/``output`` when one
module is captured (the original's keys ``mode_<mode>_input``), else ``<target>_input``/
``<target>_output`` with the target label (``L0``, ``L15_mlp``), e.g. ``mode_bf16_L15_output``.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

import numpy as np

from megatron.quant.compare.metrics import describe, error_vs_reference

if TYPE_CHECKING:  # matplotlib loads only when a figure is drawn
    from megatron.quant.analysis.figure_render import Drawn

RULE = "=" * 98
Results = Mapping[str, Mapping[str, np.ndarray]]


def tensor_name(label: str, io: str, single_target: bool) -> str:
    return io if single_target else f"{label}_{io}"


def npz_key(mode: str, name: str) -> str:
    return f"mode_{mode}_{name}"


def stats_path_for(npz_path: Path) -> Path:
    return npz_path.with_name(npz_path.stem + "_stats.json")


def build_stats(results: Results, reference: str, header: Mapping) -> dict:
    """The _stats.json document: ``header`` fields, then per mode and tensor the original's
    summary plus ``vs_reference`` errors (absent for the reference itself)."""
    modes = {}
    for mode, tensors in results.items():
        modes[mode] = {}
        for name, array in tensors.items():
            entry = describe(array)
            if mode != reference:
                entry["vs_reference"] = error_vs_reference(array, results[reference][name])
            modes[mode][name] = entry
    return {**header, "reference": reference, "modes": modes}


def write_npz(path: Path, results: Results) -> None:
    arrays = {npz_key(mode, name): array for mode, tensors in results.items() for name, array in tensors.items()}
    with _atomic_target(path) as tmp:
        with open(tmp, "wb") as handle:
            np.savez_compressed(handle, **arrays)


def write_json(path: Path, document: Mapping) -> None:
    """Strict JSON: non-finite numbers become null (the nans/infs counts say how many there were)."""
    with _atomic_target(path) as tmp:
        Path(tmp).write_text(json.dumps(_finite_or_null(document), indent=2, allow_nan=False) + "\n")


def format_screen_report(stats: Mapping) -> str:
    """The original tool's per-mode report (first 10 values, mean, std, range per tensor), plus a
    line of errors against the reference for every other mode and a summary table at the end."""
    lines: list[str] = []
    reference = stats["reference"]
    for mode, tensors in stats["modes"].items():
        lines += [RULE, f"MODE {mode}", RULE]
        for name, entry in tensors.items():
            lines += ["", f"{_heading(name)} (Shape: {entry['shape']}):",
                      f"  First 10 values: {[_number(v) for v in entry['first_10']]}",
                      f"  Mean: {_number(entry['mean'])}",
                      f"  Std:  {_number(entry['std'])}",
                      f"  Range: [{_number(entry['min'])}, {_number(entry['max'])}]"]
            if "vs_reference" in entry:
                lines.append(f"  vs {reference}: {_error_line(entry['vs_reference'])}")
        lines.append("")
    return "\n".join(lines + _summary_table(stats))


def plot_difference_histograms(results: Results, reference: str, stem: Path) -> list[tuple[Path, Drawn]]:
    """One PNG per tensor that some mode changes (``identical_tensors``: none for the others),
    ``<stem>_diff_<tensor>.png``: a histogram of (mode - reference) per mode; (path, how it was drawn) each."""
    from megatron.quant.analysis import figure_render
    from megatron.quant.analysis.plans import FigureJob

    others = [mode for mode in results if mode != reference]
    written = []
    same = identical_tensors(results, reference)
    for name, ref in (results[reference].items() if others else ()):
        if name in same:
            continue
        differences = {mode: (results[mode][name].astype(np.float64) - ref).reshape(-1) for mode in others}
        job = FigureJob(f"{stem.name}_diff_{name}.png", "", _draw_differences,
                        {"title": f"{name}: difference from {reference}", "reference": reference,
                         "differences": {mode: diff[np.isfinite(diff)] for mode, diff in differences.items()},
                         "mse": {mode: float(np.mean(diff ** 2)) for mode, diff in differences.items()}})
        written.append((stem.parent / job.path, figure_render.render(job, stem.parent, 100)))
    return written


def identical_tensors(results: Results, reference: str) -> list[str]:
    """The tensors every mode reproduces bit for bit (e.g. a layer's input under formats that quantize
    only inside it): a histogram of zeros shows nothing."""
    return [name for name, ref in results[reference].items()
            if all(np.array_equal(results[mode][name], ref) for mode in results if mode != reference)]


def _draw_differences(payload: dict):
    from matplotlib.ticker import MaxNLocator

    from megatron.quant.analysis import figures

    fig, axes = figures.subplot_grid(len(payload["differences"]), ncols=3, panel_size=(4.5, 3.2))
    # one set of bins for every mode: the panels compare modes, so a 40x wider error must look wider
    widest = max((float(np.abs(diff).max()) for diff in payload["differences"].values() if diff.size), default=0.0)
    edges = np.linspace(-widest, widest, 101) if widest > 0 else 100
    for ax, (mode, diff) in zip(axes, payload["differences"].items()):
        ax.hist(diff, bins=edges, alpha=0.8)
        ax.set_yscale("log")
        if widest > 0:
            ax.set_xlim(-widest, widest)
        ax.set_title(f"{mode} - {payload['reference']}  (MSE {payload['mse'][mode]:.3g})", fontsize=9)
        ax.set_xlabel("difference")
        ax.xaxis.set_major_locator(MaxNLocator(5))
    return figures.finish(fig, payload["title"])


def _finite_or_null(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(item) for item in value]
    return value


def _heading(name: str) -> str:
    label, _, io = name.rpartition("_")
    return f"{label} {io.upper()}" if label else io.upper()


def _summary_table(stats: Mapping) -> list[str]:
    """Every mode's error against the reference, one line per mode, per tensor."""
    reference = stats["reference"]
    others = [mode for mode in stats["modes"] if mode != reference]
    if not others:
        return []
    width = max(len(mode) for mode in others) + 2
    lines = [RULE, f"SUMMARY against {reference}", RULE]
    for name in stats["modes"][reference]:
        lines += ["", f"{_heading(name)}:",
                  f"  {'mode':<{width}}{'rel err':>12}{'SQNR (dB)':>11}{'cosine':>10}{'max abs':>13}"]
        for mode in others:
            errors = stats["modes"][mode][name]["vs_reference"]
            sqnr = "inf" if errors["mse"] == 0 else _number(errors["sqnr_db"], ".2f")
            lines.append(f"  {mode:<{width}}{_number(errors['relative_error'], '.3e'):>12}{sqnr:>11}"
                         f"{_number(errors['cosine']):>10}{_number(errors['max_abs_error'], '.3e'):>13}")
    return lines + [""]


def _error_line(errors: Mapping) -> str:
    exact = errors["mse"] == 0
    sqnr = "inf" if exact else _number(errors["sqnr_db"], ".2f")
    return (f"MSE {_number(errors['mse'], '.6e')}  MAE {_number(errors['mae'], '.6e')}  "
            f"max abs {_number(errors['max_abs_error'], '.6e')}  rel err {_number(errors['relative_error'], '.6e')}  "
            f"SQNR {sqnr} dB  cosine {_number(errors['cosine'])}")


def _number(value: float | None, spec: str = ".6f") -> str:
    # None stands for a value JSON cannot hold (no finite element, infinite, NaN).
    return "n/a" if value is None else format(value, spec)


@contextlib.contextmanager
def _atomic_target(path: Path) -> Iterator[str]:
    """A temporary path beside ``path``, renamed onto it only when the block succeeds, so no
    half-written file is ever left under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
