"""What-if re-quantization of captures written by the real tensor saver: results equal applying
megatron.quant.formats directly along the captured axis; SQNR and the best format are checked
against numpy; quantized copies, corrupt files and filters behave."""
import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from megatron.quant import formats, position, tensor_saver
from megatron.quant.compare import run_whatif, whatif_report
from megatron.quant.tensor_saver import CaptureSite, Operand, SaverConfig

FORMATS = ["hifp8", "mxfp8", "mxfp4", "nvfp4"]
CANONICAL = {name: formats.get_format(name).name for name in FORMATS}  # rows name formats canonically


def _site(layer: int, role: str) -> CaptureSite:
    return CaptureSite("linear", "linear", layer, f"decoder.layers.{layer}.mlp.linear_{role}", role, "bf16")


@pytest.fixture(scope="module")
def capture_dir(tmp_path_factory):
    """Two layers of fc1 forward operands and outputs, and one fc2 backward grad_output blocked
    along tokens."""
    root = tmp_path_factory.mktemp("captures")
    gen = torch.Generator().manual_seed(0)
    fmt = formats.get_format("mxfp8")
    tensor_saver.configure(SaverConfig(enabled=True, save_dir=str(root), iterations="0", save_quantized=True))
    try:
        position.set_iteration(0)
        position.set_microbatch(0, 0)
        for layer in (0, 1):
            # Outlier channels make the formats' block and range handling matter.
            x = torch.randn(32, 2, 64, generator=gen) * torch.logspace(-3, 2, 64)
            w = torch.randn(128, 64, generator=gen) * 0.02
            tensor_saver.capture(_site(layer, "fc1"), "forward", "pre", {
                "input": Operand(x.bfloat16(), fmt, axis=-1, quantized=fmt.quantize(x.bfloat16(), axis=-1)),
                "weight": Operand(w, fmt, axis=-1)})
            tensor_saver.capture(_site(layer, "fc1"), "forward", "post", {"output": x @ w.T})
        grad = torch.randn(32, 2, 64, generator=gen) * torch.logspace(-4, 1, 32).view(32, 1, 1)
        tensor_saver.capture(_site(1, "fc2"), "backward", "pre", {"grad_output": Operand(grad, fmt, axis=0)})
    finally:
        tensor_saver.close()
    corrupt = root / "bf16" / "20250101_000000_9999_iter000_linear_L0_forward_pre_linear_bf16_rank00_sample000_input.pt"
    corrupt.write_bytes(b"not a torch file")
    return root


@pytest.fixture(scope="module")
def outcome(capture_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("draw")
    log: list[str] = []
    args = run_whatif.build_parser().parse_args(
        ["--tensor_dir", str(capture_dir), "--output_dir", str(out), "--formats", *FORMATS])
    written = run_whatif.run(args, log=log.append)
    folder = out / "format_comparison"
    with open(folder / "format_comparison.csv") as handle:
        rows = list(csv.DictReader(handle))
    return {"folder": folder, "rows": rows, "log": log, "written": written}


def _captured(capture_dir: Path, relative: str) -> tuple[torch.Tensor, dict]:
    payload = torch.load(capture_dir / relative, weights_only=True)
    return payload["tensor"], payload["metadata"]


def test_one_row_per_high_precision_capture_and_format(outcome):
    rows = outcome["rows"]
    tensors = sorted({(r["role"], r["layer_idx"], r["tensor_name"]) for r in rows})
    assert tensors == [("fc1", "0", "input"), ("fc1", "0", "weight"), ("fc1", "1", "input"),
                       ("fc1", "1", "weight"), ("fc2", "1", "grad_output")]
    assert len(rows) == len(tensors) * len(FORMATS)
    assert any("skipping" in line and "iter000_linear_L0" in line for line in outcome["log"])


def _sqnr_db(x: torch.Tensor, q: torch.Tensor) -> float:
    x, q = x.double().numpy(), q.double().numpy()
    return 10 * math.log10(np.sum(x ** 2) / np.sum((q - x) ** 2))


def test_results_equal_applying_the_formats_package_along_the_captured_axis(outcome, capture_dir):
    for row in outcome["rows"]:
        tensor, metadata = _captured(capture_dir, row["file"])
        expected = formats.quantize(tensor.float(), row["format"], axis=metadata["axis"])
        # SQNR recomputed with numpy from the formats package's own output.
        sqnr = _sqnr_db(tensor, expected)
        assert float(row["sqnr_db"]) == pytest.approx(sqnr, rel=1e-6)
        assert float(row["relative_error"]) == pytest.approx(10 ** (-sqnr / 20), rel=1e-6)
        assert float(row["underflow_ratio"]) == ((tensor != 0) & (expected == 0)).double().mean().item()


def test_grad_output_is_blocked_along_tokens_as_captured(outcome, capture_dir):
    row = next(r for r in outcome["rows"] if r["tensor_name"] == "grad_output" and r["format"] == CANONICAL["mxfp4"])
    assert row["axis"] == "0"
    tensor, _ = _captured(capture_dir, row["file"])
    along_tokens = _sqnr_db(tensor, formats.quantize(tensor, "mxfp4", axis=0))
    along_features = _sqnr_db(tensor, formats.quantize(tensor, "mxfp4", axis=-1))
    assert float(row["sqnr_db"]) == pytest.approx(along_tokens, rel=1e-6)
    assert abs(along_tokens - along_features) > 0.5  # the rows scale by token: the axis matters


def test_best_format_per_class_has_the_highest_mean_sqnr(outcome):
    with open(outcome["folder"] / "best_formats.csv") as handle:
        best = {(r["tensor_class"], r["among_bits"]): r["format"] for r in csv.DictReader(handle)}
    for cls in {f"{r['role']}/{r['operation']}/{r['tensor_name']}" for r in outcome["rows"]}:
        means = {}
        for name in FORMATS:
            values = [float(r["sqnr_db"]) for r in outcome["rows"] if r["format"] == CANONICAL[name]
                      and f"{r['role']}/{r['operation']}/{r['tensor_name']}" == cls]
            means[CANONICAL[name]] = np.mean(values)
        assert best[(cls, "all")] == max(means, key=means.get)
        assert best[(cls, "4")] == max([CANONICAL["mxfp4"], CANONICAL["nvfp4"]], key=means.get)


def test_output_folder_holds_tables_plots_and_summary(outcome):
    names = {path.name for path in outcome["folder"].iterdir()}
    assert {"format_comparison.csv", "best_formats.csv", "summary.md", "summary.html", "by_class.png",
            "by_layer.png"} <= names
    assert set(outcome["written"]) == {outcome["folder"] / name for name in names}
    summary = (outcome["folder"] / "summary.md").read_text()
    assert "| fc2/backward/grad_output |" in summary and "(by_class.png)" in summary
    fragment = (outcome["folder"] / "summary.html").read_text()
    assert fragment.startswith('<section id="format-comparison">')
    assert fragment.count("<figure>") == fragment.count("<img") == 2  # every image with its caption
    assert "<details>" in fragment  # the per-layer small multiples fold away


def test_by_layer_panels_are_the_classes_seen_in_several_layers(outcome):
    rows = [{**row, "layer_idx": int(row["layer_idx"]), **{key: float(row[key]) for key, _ in whatif_report.PANELS}}
            for row in outcome["rows"]]
    by_layer = next(job for job in whatif_report.figure_jobs(rows) if job.path.endswith("by_layer.png"))
    layers = {}
    for row in outcome["rows"]:
        layers.setdefault(f"{row['role']}/{row['operation']}/{row['tensor_name']}", set()).add(row["layer_idx"])
    assert set(by_layer.payload) == {cls for cls, seen in layers.items() if len(seen) > 1}
    assert "fc2/backward/grad_output" not in by_layer.payload  # one layer: no line to draw


def _rows_of_run(capture_dir: Path, output_dir: Path, *extra: str) -> list[dict]:
    args = run_whatif.build_parser().parse_args(
        ["--tensor_dir", str(capture_dir), "--output_dir", str(output_dir), "--formats", "mxfp8", "--no_plots", *extra])
    run_whatif.run(args, log=lambda line: None)
    with open(output_dir / "format_comparison" / "format_comparison.csv") as handle:
        return list(csv.DictReader(handle))


def test_filters_select_captures_and_stale_outputs_go(capture_dir, tmp_path):
    stale = tmp_path / "format_comparison" / "by_layer_old.png"
    stale.parent.mkdir()
    stale.write_bytes(b"")
    rows = _rows_of_run(capture_dir, tmp_path, "--roles", "fc1", "--tensor_names", "weight")
    assert ([(r["role"], r["tensor_name"], r["layer_idx"]) for r in rows]
            == [("fc1", "weight", "0"), ("fc1", "weight", "1")])
    assert not list((tmp_path / "format_comparison").glob("*.png"))


def test_filters_take_the_report_s_ranges_and_comma_lists(capture_dir, tmp_path):
    rows = _rows_of_run(capture_dir, tmp_path, "--layers", "1-1", "--tensor_names", "weight,grad_output")
    assert sorted({(r["layer_idx"], r["tensor_name"]) for r in rows}) == [("1", "grad_output"), ("1", "weight")]


def test_gemm_results_only_on_request(capture_dir, tmp_path):
    assert "output" not in {r["tensor_name"] for r in _rows_of_run(capture_dir, tmp_path)}
    with_outputs = _rows_of_run(capture_dir, tmp_path, "--include_outputs", "--tensor_names", "output")
    assert [(r["phase"], r["layer_idx"]) for r in with_outputs] == [("post", "0"), ("post", "1")]


@pytest.mark.parametrize("extra, message", [
    (["--formats", "mxfp9"], "mxfp9"),
    (["--roles", "fc3"], "--roles fc3: no capture has this value; available: fc1, fc2"),
])
def test_bad_arguments_are_clear_errors(capture_dir, tmp_path, capsys, extra, message):
    code = run_whatif.main(["--tensor_dir", str(capture_dir), "--output_dir", str(tmp_path), *extra])
    assert code == 2
    assert message in capsys.readouterr().err


def test_missing_tensor_dir_is_a_clear_error(tmp_path, capsys):
    assert run_whatif.main(["--tensor_dir", str(tmp_path / "nowhere")]) == 2
    assert "tensor directory does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("report_first", [True, False])
def test_comparison_joins_the_visualization_report(capture_dir, tmp_path, report_first):
    from html.parser import HTMLParser
    from urllib.parse import unquote

    from megatron.quant.analysis import cli

    def report():
        assert cli.main(["--tensor_dir", str(capture_dir), "--output_dir", str(tmp_path),
                         "--analyses", "quick", "--workers", "1"]) in (0, 1)

    def compare():
        run_whatif.run(run_whatif.build_parser().parse_args(
            ["--tensor_dir", str(capture_dir), "--output_dir", str(tmp_path), "--formats", "mxfp8", "nvfp4"]),
            log=lambda _: None)

    for step in ((report, compare) if report_first else (compare, report)):
        step()

    class Targets(HTMLParser):
        def __init__(self):
            super().__init__()
            self.found: list[str] = []

        def handle_starttag(self, tag, attrs):
            self.found += [v for k, v in attrs if (tag, k) in (("a", "href"), ("img", "src"))]

    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert 'id="format-comparison"' in page and "href='#format-comparison'" in page
    parser = Targets()
    parser.feed(page)
    files = [unquote(t) for t in parser.found if not t.startswith("#")]
    assert any(t.startswith("format_comparison/") for t in files)
    assert all((tmp_path / t).is_file() for t in files), [t for t in files if not (tmp_path / t).is_file()]
