"""The manifest and capture readers validate every record once, at the reading boundary: a
hostile manifest line or capture file among good ones is skipped and listed by the visualizer
and compare_formats, never a traceback or a stall."""
import json
from pathlib import Path

import pytest
import torch

from tests.analysis.capture_fixture import FAST, tiny_run

BAD_LINES = {  # tensor_name of the entry -> how its manifest line is broken
    "deep": lambda entry: '{"metadata": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "infinite": lambda entry: json.dumps({**entry, "metadata": {**entry["metadata"], "layer_idx": float("inf")}}),
    "textstats": lambda entry: json.dumps({**entry, "metadata": {
        **entry["metadata"], "stats": {**entry["metadata"]["stats"], "min": "low", "absmax": "high"}}}),
}
BAD_FILES = {  # tensor in a capture file (built when written) -> the reason the reader gives
    "sparse": (lambda: torch.sparse_coo_tensor([[0, 3]], [1.0, 2.0], (8,), check_invariants=True),
               "sparse_coo tensor"),
    "stride0": (lambda: torch.zeros(1, 1).expand(2**20, 2**20), "claims 1099511627776 elements"),
}


@pytest.fixture(scope="module")
def hostile_logs(tmp_path_factory) -> Path:
    """One quant type's captures plus three broken manifest lines and two hostile files (3 KB
    each); each bad one has its own tensor_name so the tests can tell it was never analysed."""
    root = tmp_path_factory.mktemp("hostile") / "logs"
    files = tiny_run(root, quant_types=("hifp8",), layers=(0,), ranks=(0,), stats_iterations=(1,),
                     quantized_copies=False)
    manifest = files[0].parent / "manifest-rank00.jsonl"
    lines = manifest.read_text().splitlines()
    stats_entry = next(json.loads(line) for line in lines if json.loads(line).get("file") is None)
    for name, broken in BAD_LINES.items():
        entry = {**stats_entry, "metadata": {**stats_entry["metadata"], "tensor_name": name}}
        lines.append(broken(entry))
    file_entry = json.loads(lines[0])
    for name, (make, _) in BAD_FILES.items():
        target = files[0].parent / files[0].name.replace("_input.pt", f"_{name}.pt").replace("_0000_", "_9000_")
        metadata = {**file_entry["metadata"], "tensor_name": name}
        torch.save({"tensor": make(), "metadata": metadata}, target)
        lines.append(json.dumps({**file_entry, "file": target.name, "metadata": metadata}))
    manifest.write_text("\n".join(lines) + "\n")
    return root


def test_visualizer_skips_and_lists_each_hostile_record(hostile_logs, tmp_path):
    from megatron.quant.analysis.cli import main

    out = tmp_path / "draw"
    assert main(["--tensor_dir", str(hostile_logs), "--output_dir", str(out), "--analyses", "quick", *FAST]) == 0
    skipped = json.loads((out / ".report" / "report.json").read_text())["run"]["skipped"]
    reasons = " | ".join(f"{entry['path']}: {entry['reason']}" for entry in skipped)
    for text in ("JSON nested too deeply", "layer_idx is inf, not an integer", "stats.min is 'low', not a number",
                 *(reason for _, reason in BAD_FILES.values())):
        assert text in reasons, reasons
    index = (out / "index.html").read_text()
    assert not any(name in index.split("Skipped")[0] for name in ("stride0", "textstats"))


def test_compare_formats_skips_and_lists_each_hostile_record(hostile_logs, tmp_path):
    from megatron.quant.compare.run_whatif import build_parser, run

    log: list[str] = []
    run(build_parser().parse_args(["--tensor_dir", str(hostile_logs), "--output_dir", str(tmp_path / "draw"),
                                   "--formats", "mxfp8", "--no_plots"]), log.append)
    text = "\n".join(log)
    for reason in ("JSON nested too deeply", "layer_idx is inf", *(reason for _, reason in BAD_FILES.values())):
        assert reason in text, text


def test_load_capture_refuses_a_stride0_tensor_without_walking_it(tmp_path):
    from megatron.quant.analysis.captures.loading import CaptureLoadError, load_capture

    path = tmp_path / "x.pt"
    torch.save({"tensor": BAD_FILES["stride0"][0](), "metadata": {}}, path)
    assert path.stat().st_size < 4096
    with pytest.raises(CaptureLoadError, match=r"claims 1099511627776 elements .* stores 4 bytes"):
        load_capture(path)
