"""What-if outputs in ``<output_dir>/format_comparison/``: CSV tables, PNG plots, and a
``summary.md`` / ``summary.html`` fragment that the visualization report links to."""
from __future__ import annotations

import csv
import html
import re
from pathlib import Path
from typing import Mapping, Sequence

from megatron.quant.compare.whatif import IDENTITY_FIELDS, tensor_class

FOLDER = "format_comparison"
STAT_COLUMNS = ("format", "bits", "sqnr_db", "relative_error", "rel_mse", "cosine",
                "overflow", "overflow_ratio", "underflow", "underflow_ratio")
PANELS = (("sqnr_db", "SQNR (dB)"), ("relative_error", "relative error"),
          ("overflow_ratio", "overflow ratio"), ("underflow_ratio", "underflow ratio"))


def write_tables(rows: Sequence[Mapping], best: Sequence[Mapping], folder: Path) -> list[Path]:
    """``format_comparison.csv`` (one row per tensor and format) and ``best_formats.csv``."""
    folder.mkdir(parents=True, exist_ok=True)
    per_tensor = folder / "format_comparison.csv"
    _write_csv(per_tensor, [*IDENTITY_FIELDS, "file", "axis", "tensor_class", *STAT_COLUMNS],
               [{**row, "tensor_class": tensor_class(row)} for row in rows])
    best_path = folder / "best_formats.csv"
    _write_csv(best_path, ["tensor_class", "among_bits", "format", "bits", "mean_sqnr_db", "tensors"], best)
    return [per_tensor, best_path]


def plot_by_class(rows: Sequence[Mapping], folder: Path) -> Path:
    """``by_class.png``: per tensor class, the mean of each statistic for each format (grouped bars)."""
    plt = _pyplot()
    classes = sorted({tensor_class(row) for row in rows})
    formats = list(dict.fromkeys(row["format"] for row in rows))
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(max(8, 1.1 * len(classes) * len(formats) / 3), 3.2 * len(PANELS)))
    width = 0.8 / len(formats)
    for ax, (key, title) in zip(axes, PANELS):
        for offset, name in enumerate(formats):
            means = [_mean([r[key] for r in rows if r["format"] == name and tensor_class(r) == cls]) for cls in classes]
            ax.bar([i + offset * width for i in range(len(classes))], means, width, label=name)
        ax.set_title(title)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(classes))], classes, rotation=30, ha="right", fontsize=8)
    axes[0].legend(fontsize=8, ncol=min(len(formats), 6))
    return _save(fig, plt, folder / "by_class.png")


def plot_by_layer(rows: Sequence[Mapping], folder: Path) -> list[Path]:
    """``by_layer_<class>.png`` per tensor class: each statistic against the layer index, one line per format."""
    plt = _pyplot()
    written = []
    for cls in sorted({tensor_class(row) for row in rows}):
        subset = [row for row in rows if tensor_class(row) == cls]
        layers = sorted({row["layer_idx"] for row in subset if row["layer_idx"] is not None})
        fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.2))
        for ax, (key, title) in zip(axes, PANELS):
            for name in dict.fromkeys(row["format"] for row in subset):
                means = [_mean([r[key] for r in subset if r["format"] == name and r["layer_idx"] == layer])
                         for layer in layers]
                ax.plot(layers, means, marker="o", label=name)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("layer")
        axes[0].legend(fontsize=7)
        fig.suptitle(cls)
        written.append(_save(fig, plt, folder / f"by_layer_{_slug(cls)}.png"))
    return written


def write_summary(best: Sequence[Mapping], images: Sequence[Path], tensors: int, folder: Path) -> list[Path]:
    """``summary.md`` and ``summary.html`` (a fragment): best format per tensor class, and the plots."""
    overall = [row for row in best if row["among_bits"] == "all"]
    by_width = [row for row in best if row["among_bits"] != "all"]
    md = [f"## Format comparison (what-if re-quantization of {tensors} captured tensors)", "",
          "Best format per tensor class: highest mean SQNR over the class's tensors.", "",
          "| tensor class | best overall | SQNR (dB) | best per bit width |", "|---|---|---|---|"]
    for row in overall:
        widths = ", ".join(f"{b['bits']}-bit: {b['format']}" for b in by_width if b["tensor_class"] == row["tensor_class"])
        md.append(f"| {row['tensor_class']} | {row['format']} | {row['mean_sqnr_db']:.2f} | {widths} |")
    md += ["", "Tables: [format_comparison.csv](format_comparison.csv), [best_formats.csv](best_formats.csv)", ""]
    md += [f"![{image.stem}]({image.name})" for image in images]
    md_path = folder / "summary.md"
    md_path.write_text("\n".join(md) + "\n")

    cells = "".join(
        f"<tr><td>{html.escape(row['tensor_class'])}</td><td>{html.escape(row['format'])}</td>"
        f"<td>{row['mean_sqnr_db']:.2f}</td></tr>" for row in overall)
    figures = "".join(f'<img src="{FOLDER}/{html.escape(image.name)}" alt="{html.escape(image.stem)}">'
                      for image in images)
    fragment = (f'<section id="format-comparison"><h2>Format comparison</h2>'
                f"<p>What-if re-quantization of {tensors} captured tensors; best format per tensor class "
                f'by mean SQNR. Tables: <a href="{FOLDER}/format_comparison.csv">per tensor</a>, '
                f'<a href="{FOLDER}/best_formats.csv">best formats</a>.</p>'
                f"<table><tr><th>tensor class</th><th>best format</th><th>SQNR (dB)</th></tr>{cells}</table>"
                f"{figures}</section>\n")
    html_path = folder / "summary.html"
    html_path.write_text(fragment)
    return [md_path, html_path]


def _write_csv(path: Path, columns: Sequence[str], rows: Sequence[Mapping]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, plt, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
