"""index.html: one self-contained page (inline CSS, relative links) over every analysis drawn
into an output directory.

Each run stores its sections under ``.report/`` so that running the scripts one after the
other (quick, basic, enhanced) into the same directory yields one report covering all of
them; sections of a run on another tensor directory are dropped.
"""
from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import quote

STATE_DIR = ".report"
NOTES_FILE = "NOTES.txt"  # in a section's folder: what was not drawn and why
INDEX = "index.html"
# Written by script/compare_formats.py into the same output directory (links relative to it).
COMPARISON_FRAGMENT = Path("format_comparison") / "summary.html"


@dataclass
class Section:
    key: str
    title: str
    folder: str
    description: str
    figures: list[dict] = field(default_factory=list)  # {"path", "caption"}
    files: list[dict] = field(default_factory=list)    # {"path", "caption"}
    notes: list[str] = field(default_factory=list)


@dataclass
class RunSummary:
    tensor_dir: str
    generated_at: str
    command: str
    filters: str
    options: str
    totals: dict                 # label -> value, shown as a table
    per_quant_type: list[dict]   # one row per quant type
    skipped: list[dict]          # {"path", "reason"}


def write_report(output_dir: Path, run: RunSummary, sections: list[Section],
                 order: list[str]) -> Path:
    """Store this run's sections, merge those of earlier runs, write index.html."""
    state = output_dir / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    previous = _load_state(state)
    if previous is None or previous["run"]["tensor_dir"] != run.tensor_dir:
        previous = {"sections": {}}
    merged = {**previous["sections"], **{s.key: asdict(s) for s in sections}}
    merged = {key: merged[key] for key in order if key in merged}
    (state / "report.json").write_text(json.dumps({"run": asdict(run), "sections": merged},
                                                  indent=1), encoding="utf-8")
    index = output_dir / INDEX
    index.write_text(render_html(run, [Section(**s) for s in merged.values()], output_dir),
                     encoding="utf-8")
    return index


def refresh_index(output_dir: Path) -> Path | None:
    """Re-render index.html from the stored sections (e.g. after a format comparison was added);
    None when no report has been written into ``output_dir``."""
    data = _load_state(output_dir / STATE_DIR)
    if data is None:
        return None
    index = output_dir / INDEX
    index.write_text(render_html(RunSummary(**data["run"]), [Section(**s) for s in data["sections"].values()],
                                 output_dir), encoding="utf-8")
    return index


def _load_state(state: Path) -> dict | None:
    try:
        data = json.loads((state / "report.json").read_text(encoding="utf-8"))
        return data if {"run", "sections"} <= set(data) else None
    except (OSError, ValueError):
        return None


def link(path: str) -> str:
    """``path`` as an href/src attribute value."""
    return html.escape(quote(path), quote=True)


def table(header: list[str], rows: list[list[object]]) -> str:
    """An HTML table; floats to 5 significant digits, ints with thousands separators."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure_html(path: str, caption: str) -> str:
    """A linked PNG (``path`` relative to the page) with its caption."""
    return (f"<figure><a href='{link(path)}'><img src='{link(path)}' alt='{html.escape(path, quote=True)}'"
            f" loading='lazy'></a><figcaption><b>{html.escape(path)}</b>: {html.escape(caption)}"
            "</figcaption></figure>")


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.5g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1250px;padding:0 1em;color:#222}
h1{margin-bottom:.2em} h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0 1em} td,th{border:1px solid #ccc;padding:.25em .6em;
text-align:left;font-size:.9em} th{background:#f3f3f3}
figure{margin:1em 0 2em} img{max-width:100%;height:auto;border:1px solid #eee}
table{display:block;max-width:100%;overflow-x:auto} pre{white-space:pre-wrap;overflow-wrap:anywhere}
details{margin:1em 0} summary{cursor:pointer;font-weight:600}
figcaption{color:#555;font-size:.9em} .note{background:#fff6dd;border-left:4px solid #e0a800;
padding:.4em .8em;margin:.4em 0} nav a{margin-right:1em} code{background:#f3f3f3;padding:0 .2em}
"""


def _nothing_drawn(section: Section) -> bool:
    """A section with no figure and no file but its notes on why (one line of the "Not drawn" list)."""
    return not section.figures and bool(section.notes) and all(
        Path(item["path"]).name == NOTES_FILE for item in section.files)


def render_html(run: RunSummary, sections: list[Section], output_dir: Path) -> str:
    # An analysis with nothing to say does not apply to these captures (the experts of a dense model).
    sections = [section for section in sections if section.figures or section.files or section.notes]
    empty = [section for section in sections if _nothing_drawn(section)]
    drawn = [section for section in sections if section not in empty]
    comparison = output_dir / COMPARISON_FRAGMENT
    comparison_html = comparison.read_text(encoding="utf-8") if comparison.is_file() else None
    parts = [
        "<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
        "<title>Tensor capture report</title>", f"<style>{STYLE}</style></head><body>",
        "<h1>Tensor capture report</h1>",
        f"<p>Captures in <code>{html.escape(run.tensor_dir)}</code>, generated "
        f"{html.escape(run.generated_at)} by <code>{html.escape(run.command)}</code>.</p>",
        "<nav>" + "".join(f"<a href='#{s.key}'>{html.escape(s.title)}</a>" for s in drawn)
        + ("<a href='#format-comparison'>Format comparison</a>" if comparison_html else "")
        + ("<a href='#not-drawn'>Not drawn</a>" if empty else "")
        + "<a href='#skipped'>Skipped files</a></nav>",
        "<h2 id='summary'>Summary</h2>",
        table(["", ""], [[k, v] for k, v in run.totals.items()]
              + [["filters", run.filters], ["options", run.options]]),
    ]
    if run.per_quant_type:
        header = list(run.per_quant_type[0])
        parts.append(table(header, [[row[h] for h in header] for row in run.per_quant_type]))
    for section in drawn:
        parts.append(f"<h2 id='{html.escape(section.key)}'>{html.escape(section.title)}</h2>")
        where = f"folder <code>{html.escape(section.folder)}/</code>: " if section.folder else ""
        parts.append(f"<p>{where}{html.escape(section.description)}</p>")
        parts += [f"<p class='note'>{html.escape(note)}</p>" for note in section.notes]
        for item in section.files:
            parts.append(f"<p><a href='{link(item['path'])}'>{html.escape(item['path'])}</a>: "
                         f"{html.escape(item['caption'])}</p>")
        for item in section.figures:
            if not (output_dir / item["path"]).is_file():
                continue  # a figure of an earlier run that this run's settings did not redraw
            parts.append(figure_html(item["path"], item["caption"]))
    if comparison_html:
        parts.append(comparison_html)
    if empty:
        parts.append("<h2 id='not-drawn'>Not drawn</h2><p>What these captures cannot show, and what would:</p><ul>"
                     + "".join(f"<li><b>{html.escape(s.title)}</b>: "
                               f"{html.escape(' '.join(note.removeprefix('Not drawn: ') for note in s.notes))}</li>"
                               for s in empty) + "</ul>")
    parts.append(f"<h2 id='skipped'>Skipped files ({len(run.skipped)})</h2>")
    if run.skipped:
        parts.append(table(["file", "reason"], [[s["path"], s["reason"]] for s in run.skipped]))
    else:
        parts.append("<p>None: every capture file was read.</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
