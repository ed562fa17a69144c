"""``bench/gpu_check.py --dry-run``: the default stages and the correct stage on the CPU, the files and
fields a device run writes; and the command line's refusals."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.gpu import cli

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # its train stage launches training processes
def test_the_dry_run_writes_every_stage_with_its_fields(tmp_path):
    stages = [arg for name in ("env", "correct", "kernels", "train") for arg in ("--stage", name)]
    done = subprocess.run([sys.executable, "bench/gpu_check.py", "--dry-run", "--out", str(tmp_path), *stages],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "correct.json", "env.json", "gpu_check.log", "kernels.json", "summary.md", "train.json"]
    records = {name: json.loads((tmp_path / f"{name}.json").read_text())
               for name in ("env", "correct", "kernels", "train")}
    for name, record in records.items():
        assert (record["stage"], record["device"], record["status"]) == (name, "cpu (dry run)", "done")
    env = records["env"]
    assert env["copy_gbps"] > 0 and env["gemm_bf16_tflops"] > 0 and env["python"] and env["torch"] == torch.__version__
    assert env["dependencies"]["megatron.core"][0].isdigit()
    correct = records["correct"]
    assert correct["exit_code"] == 0 and sum(correct["counts"].values()) > 0 and correct["failures"] == []
    kernels = records["kernels"]
    assert kernels["rows"] and kernels["not_reached"] == []
    for row in kernels["rows"]:
        assert row["gbps"] > 0 and 0 < row["pct_of_copy"]
    assert {row["axes"] for row in kernels["rows"]} == {"single-axis", "dual-axis", "with-counts", "with-full-stats"}
    train = records["train"]
    assert [(row["model"], row["variant"]) for row in train["rows"]] == [
        ("llama-tiny", "bf16"), ("llama-tiny", "hifp8"), ("llama-moe-tiny", "bf16"),
        ("llama-moe-tiny", "deepseek-v3-fp8")]
    for row in train["rows"]:
        assert row["step_s"] > 0 and "mfu" in row and row["kernel_path"].startswith("kernels auto: ")
    assert train["rows"][0]["ratio_to_bf16"] == 1.0 and train["rows"][1]["ratio_to_bf16"] > 0
    assert sum(b["share"] for b in train["baseline_profile"]["buckets"].values()) == pytest.approx(1.0)
    for row in train["rows"]:  # every run profiled: its buckets' time per step, and how busy the device was
        assert sum(row["bucket_s"].values()) == pytest.approx(row["busy"] * row["step_s"]) and row["busy"] > 0
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("# GPU check: cpu (dry run)") and "| train | done |" in summary


def test_a_bad_budget_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--dry-run", "--budget-s", "0"])
    assert exit_.value.code == 2 and "--budget-s must be positive, not 0" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="refuses only where there is no CUDA device")
def test_without_a_gpu_only_the_dry_run_is_allowed(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args([])
    assert exit_.value.code == 2 and "torch sees no CUDA device" in capsys.readouterr().err


def test_device_names_become_file_name_parts():
    assert cli.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
