"""Damaged and foreign files are skipped and named; bad directories and filters are clear
errors with a non-zero exit; filters select exactly what they say."""
import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from capture_fixture import FAST, tiny_run

from megatron.quant.analysis.cli import main

REPO = Path(__file__).resolve().parents[3]


def _small_run(root: Path) -> list[Path]:
    return tiny_run(root, quant_types=("hifp8",), layers=(0,), ranks=(0,), stats_iterations=(),
                    quantized_copies=False)


@pytest.fixture
def damaged_logs(tmp_path) -> tuple[Path, dict[str, str]]:
    """A healthy capture directory plus one of each kind of bad file; name -> expected reason."""
    root = tmp_path / "logs"
    files = _small_run(root)
    directory = files[0].parent
    truncated = directory / files[0].name.replace("_0000_", "_9000_")
    truncated.write_bytes(files[0].read_bytes()[:300])
    garbage = directory / files[1].name.replace("_0001_", "_9001_")
    garbage.write_bytes(b"\x00not a torch file" * 10)
    foreign = directory / files[2].name.replace("_0002_", "_9002_")
    torch.save([1, 2, 3], foreign)
    (directory / "notes.txt").write_text("hello")
    (directory / "old_style_hifp8_query.pt").write_bytes(files[0].read_bytes())
    manifest = directory / "manifest-rank00.jsonl"
    lines = manifest.read_text().splitlines()
    missing = json.loads(lines[3])
    missing["file"] = "20250908_095220_9999_iter000_linear_L0_forward_pre_linear_hifp8_rank00_sample000_gone.pt"
    manifest.write_text("\n".join(lines + ["{not json", json.dumps(missing)]) + "\n")
    return root, {truncated.name: "cannot be loaded", garbage.name: "cannot be loaded",
                  foreign.name: "not a capture", "notes.txt": "not a capture file",
                  "old_style_hifp8_query.pt": "does not match the capture naming pattern",
                  "manifest-rank00.jsonl:": "bad manifest line", missing["file"]: "missing"}


def test_damaged_and_foreign_files_are_skipped_and_named(damaged_logs, tmp_path, capsys):
    root, expected = damaged_logs
    out = tmp_path / "draw"
    assert main(["--tensor_dir", str(root), "--output_dir", str(out), "--analyses", "quick",
                 *FAST]) == 0
    assert f"{len(expected)} file(s) skipped" in capsys.readouterr().out
    index = (out / "index.html").read_text()
    stats = (out / "tensor_stats.txt").read_text()
    for name, reason in expected.items():
        assert name in index and name in stats
        line = next(line for line in stats.splitlines() if name in line)
        assert reason in line, line


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "absent", "does not exist"),
    (lambda p: p, "no capture files"),
    (lambda p: (p / "file.txt").write_text("x") and p / "file.txt", "not a directory"),
])
def test_missing_empty_or_wrong_directory_is_an_error(tmp_path, capsys, make, message):
    tensor_dir = make(tmp_path)
    assert main(["--tensor_dir", str(tensor_dir), "--output_dir", str(tmp_path / "draw"),
                 *FAST]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "draw" / "index.html").exists()


def test_directory_of_only_damaged_files_is_an_error(tmp_path, capsys):
    (tmp_path / "20250908_095220_0000_iter000_linear_L0_forward_pre_linear_hifp8_rank00"
                "_sample000_input.pt").write_bytes(b"garbage")
    assert main(["--tensor_dir", str(tmp_path), "--output_dir", str(tmp_path / "draw"),
                 *FAST]) == 2
    assert "no readable capture" in capsys.readouterr().err


def test_script_exits_non_zero_with_a_message(tmp_path):
    done = subprocess.run([sys.executable, "script/quick_visualize.py", "--tensor_dir",
                           str(tmp_path / "absent"), "--output_dir", str(tmp_path / "draw")],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2
    assert "tensor directory does not exist" in done.stderr


def _manifest_entries(root: Path) -> list[dict]:
    """Every capture as the manifests list it (the oracle for the filters)."""
    return [json.loads(line)["metadata"] for manifest in sorted(root.rglob("manifest-*.jsonl"))
            for line in manifest.read_text().splitlines() if line.strip()]


def _csv_rows(out: Path) -> list[dict]:
    with (out / "statistics" / "tensor_summary.csv").open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("options, keep", [
    (["--quant_types", "hifp8,mxfp4"], lambda m: m["quant_type"] in ("hifp8", "mxfp4")),
    (["--layers", "1"], lambda m: m["layer_idx"] == 1),
    (["--roles", "fc2", "core_attention"], lambda m: m["role"] in ("fc2", "core_attention")),
    (["--tensor_names", "input", "grad_output"],
     lambda m: m["tensor_name"] in ("input", "grad_output")),
    (["--iterations", "0-1"], lambda m: m["iteration"] in (0, 1)),
    (["--ranks", "1"], lambda m: m["rank"] == 1),
    (["--quant_types", "mxfp8", "--layers", "0", "--roles", "qkv", "--tensor_names", "weight",
      "--iterations", "2", "--ranks", "0"],
     lambda m: (m["quant_type"], m["layer_idx"], m["role"], m["tensor_name"], m["iteration"],
                m["rank"]) == ("mxfp8", 0, "qkv", "weight", 2, 0)),
])
def test_filters_select_what_they_say(tiny_logs, tmp_path, options, keep):
    out = tmp_path / "draw"
    assert main(["--tensor_dir", str(tiny_logs), "--output_dir", str(out), "--analyses",
                 "statistics", *options, *FAST]) == 0
    expected = sorted((m["quant_type"], m["layer_idx"], m["role"], m["tensor_name"],
                       m["operation"], m["phase"], m["iteration"], m["rank"])
                      for m in _manifest_entries(tiny_logs) if keep(m) and not m["quantized"])
    got = sorted((r["quant_type"], int(r["layer_idx"]), r["role"], r["tensor_name"],
                  r["operation"], r["phase"], int(r["iteration"]), int(r["rank"]))
                 for r in _csv_rows(out))
    assert got == expected and expected


def test_filter_value_matching_nothing_is_an_error_listing_the_values(tiny_logs, tmp_path,
                                                                       capsys):
    assert main(["--tensor_dir", str(tiny_logs), "--output_dir", str(tmp_path),
                 "--quant_types", "fp99", *FAST]) == 2
    error = capsys.readouterr().err
    assert "fp99" in error and "available: bf16, hifp8, mxfp4, mxfp8" in error


def test_unknown_analysis_is_an_error_listing_the_valid_ones(tiny_logs, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--tensor_dir", str(tiny_logs), "--output_dir", str(tmp_path),
              "--analyses", "histograms"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "histograms" in error and "distributions" in error and "enhanced" in error


def test_directory_without_manifests_is_read_from_file_names(tmp_path):
    root = tmp_path / "logs"
    files = _small_run(root)
    for manifest in root.rglob("manifest-*.jsonl"):
        manifest.unlink()
    shutil.copy(files[0], root / "hifp8" / "stray.txt")
    out = tmp_path / "draw"
    # Roles are not in file names: the role filter applies once the files' metadata is read.
    assert main(["--tensor_dir", str(root), "--output_dir", str(out), "--analyses",
                 "statistics", "--roles", "fc2", *FAST]) == 0
    rows = _csv_rows(out)
    assert {r["role"] for r in rows} == {"fc2"}
    assert len(rows) == sum("fc2" in torch.load(f, weights_only=True)["metadata"]["role"]
                            for f in files)


def test_the_captures_own_statistics_log_is_no_skipped_file(tmp_path):
    """An inspect config's statistics log (nvdlfw-inspect's line format, beside the captures) is the
    capture's own output, not a foreign file."""
    from megatron.quant.analysis.captures.catalog import build_catalog

    root = tmp_path / "logs"
    _small_run(root)
    log = root / "nvdlfw_inspect_statistics_logs" / "nvdlfw_inspect_globalrank-0.log"
    log.parent.mkdir()
    log.write_text("INFO - decoder.layers.0.mlp.linear_fc1_activation_mean \t iteration=000001 \t value=0.1\n")
    (root / "notes.txt").write_text("hello")
    assert [s.path for s in build_catalog(root).skipped] == ["notes.txt"]
