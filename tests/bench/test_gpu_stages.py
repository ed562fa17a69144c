"""The GPU check's stages, piece by piece: plans, parsing, goals, buckets, the pytest rows, the wheels."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu import correct_stage, kernels_stage, profile_buckets, train_stage, wheels
from bench.gpu.registry import DEFAULT_BUDGET_S, DEFAULT_STAGES, STAGES
from bench.gpu.runner import LOG_NAME, SUMMARY_NAME
from megatron.quant import kernels
from megatron.quant.formats import get_format
from megatron.quant.recipes.recipe import QuantRecipe

REPO = Path(__file__).resolve().parents[2]


def test_the_stages_fit_the_out_folder_and_the_default_ones_fit_the_budget():
    assert len(STAGES) + 2 <= 8  # a JSON per stage, summary.md and the log: what a remote run may bring back
    assert {LOG_NAME, SUMMARY_NAME}.isdisjoint(f"{name}.json" for name in STAGES)
    assert DEFAULT_STAGES == ("env", "kernels", "train")  # how fast: the kernels first, on an unused machine
    assert sum(STAGES[name].estimate_s for name in DEFAULT_STAGES) < DEFAULT_BUDGET_S <= 600  # one 10-minute run
    assert STAGES["correct"].estimate_s * 1.5 < 600  # the second call, allowed its overrun


def test_train_interleaves_the_baseline_and_runs_every_preset():
    order = train_stage.schedule(train_stage.COLD)
    dense, moe = "llama3.2-1b", "deepseek-v3-small"
    assert order == [(dense, v) for v in ("bf16", "te-mxfp8", "te-nvfp4", "te-fp8-current", "te-fp8-delayed",
                                          "bf16", "te-fp8-blockwise", "mxfp4", "hifp8")] + [
        (moe, "bf16"), (moe, "deepseek-v3-fp8")]  # the mixture of experts after the dense model
    for variant in (*train_stage.COLD.variants, *train_stage.COLD.moe_variants):
        QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": variant})  # a recipe the training run accepts


def test_the_kernel_path_is_read_from_the_start_line_as_printed():
    path = kernels.describe([get_format("mxfp8_e4m3"), get_format("nvfp4", rounding="stochastic")], False, "auto", True)
    line = f"parallel: TP 1 x PP 1 x DP 1 | precision bf16 | quantization te-nvfp4 | device cuda | {path}"
    output = f"model: llama3.2-1b | layers 16\n{line}\nparameters: 1,235,814,400\n"
    assert train_stage.kernel_path(output) == path
    assert train_stage.kernel_path(output.replace(path, path + " | attention sdpa")) == path  # a field added later
    assert train_stage.kernel_path("no start line") is None


def _run(variant, step, path="kernels auto: triton mxfp8_e4m3", model="dense"):
    return {"model": model, "variant": variant, "exit_code": 0, "step_s": step, "mfu": 0.1 / step,
            "tflops": 99 / step, "kernel_path": path, "loss_last": 11.0}


def test_train_rows_take_ratios_against_the_baseline_runs_median_and_flag_eager_on_the_gpu():
    runs = [_run("bf16", 1.0, "kernels auto: none"), _run("te-mxfp8", 2.2), _run("bf16", 1.2, "kernels auto: none"),
            _run("hifp8", 3.3, "kernels torch: eager hifp8 (WARNING: eager quantization on the GPU)"),
            {"model": "dense", "variant": "mxfp4", "exit_code": None, "kernel_path": None,
             "error": "killed at the deadline"},
            _run("bf16", 5.0, "kernels auto: none", model="moe"), _run("deepseek-v3-fp8", 6.0, model="moe")]
    rows = {(row["model"], row["variant"]): row for row in train_stage.rows(runs, cuda=True)}
    assert rows["dense", "bf16"]["step_s"] == pytest.approx(1.1) and rows["dense", "bf16"]["runs"] == 2
    assert rows["dense", "te-mxfp8"]["ratio_to_bf16"] == pytest.approx(2.0)
    assert not rows["dense", "te-mxfp8"]["eager_on_gpu"]
    assert rows["dense", "hifp8"]["eager_on_gpu"] and rows["dense", "hifp8"]["ratio_to_bf16"] == pytest.approx(3.0)
    assert rows["dense", "mxfp4"] == {"model": "dense", "variant": "mxfp4", "error": "killed at the deadline",
                                      "kernel_path": None}
    assert rows["moe", "deepseek-v3-fp8"]["ratio_to_bf16"] == pytest.approx(1.2)  # against its own model's bf16
    assert not any(row.get("eager_on_gpu") for row in train_stage.rows(runs, cuda=False))


@pytest.mark.parametrize("name,expected", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "GEMMs"),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNT", "GEMMs"),
    ("_block_kernel", "quantization"), ("_dual_kernel", "quantization"), ("_amax_kernel", "quantization"),
    ("void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 11, false>", "attention"),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor<float>>", "optimizer"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", "norms"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "other"),
    ("aten::mm", "GEMMs"), ("aten::bmm", "attention"), ("aten::_foreach_mul_", "optimizer"),
])
def test_profile_buckets_by_name(name, expected):
    assert profile_buckets.bucket(name) == expected


def test_profile_bucket_times_are_per_step_and_shares_sum_to_one():
    timed = profile_buckets.bucket_times([("aten::mm", 3.0), ("_block_kernel", 1.0), ("aten::add", 0.0)], steps=2)
    assert timed["buckets"]["GEMMs"] == {"s_per_step": 1.5, "share": 0.75}
    assert sum(b["share"] for b in timed["buckets"].values()) == pytest.approx(1.0)
    assert [t["name"] for t in timed["top"]] == ["aten::mm", "_block_kernel", "aten::add"]


def _row(fmt, axes, ms, mode="triton", goal=1 / 0.85):
    copy_ms = 1.0
    return {"format": fmt, "dtype": "float32", "mode": mode, "axes": axes, "ms": ms, "GBps": 2e12 / ms,
            "copy_GBps": 2e12 / copy_ms, "ratio_to_clone": ms / copy_ms, "goal": goal, "meets_goal": ms <= goal}


def test_kernel_rows_carry_bandwidth_and_the_goals_against_copy_and_single_axis():
    rows = {(r["format"], r["axes"], r["mode"]): r for r in kernels_stage.checked([
        _row("mxfp8_e4m3", "single-axis", 1.25), _row("mxfp8_e4m3", "dual-axis", 1.5),
        _row("mxfp8_e4m3", "with-full-stats", 1.5), _row("hifp8", "single-axis", 1.1),
        _row("hifp8", "single-axis", 5.0, mode="eager", goal=float("inf"))])}
    single = rows["mxfp8_e4m3", "single-axis", "triton"]
    assert single["gbps"] == pytest.approx(1600) and single["pct_of_copy"] == pytest.approx(80)
    assert single["goal"] == ">= 85 % of copy" and single["meets_goal"] is False
    assert rows["hifp8", "single-axis", "triton"]["meets_goal"] is True
    dual = rows["mxfp8_e4m3", "dual-axis", "triton"]
    assert (dual["ratio_to_single"] == pytest.approx(1.2) and dual["goal"] == "<= 1.3x single-axis"
            and dual["meets_goal"])
    assert rows["mxfp8_e4m3", "with-full-stats", "triton"]["meets_goal"] is False  # 1.2x > 1.1x
    assert rows["hifp8", "single-axis", "eager"]["goal"] is None


def test_a_cast_to_the_inputs_own_dtype_answers_no_goal():
    rows = kernels_stage.checked([_row("fp32", "single-axis", 0.1), _row("fp32", "dual-axis", 0.15),
                                  _row("bf16", "single-axis", 0.5)])  # inputs are float32
    assert [(r["goal"], r.get("note")) for r in rows[:2]] == [(None, kernels_stage.NO_WORK)] * 2
    assert rows[2]["goal"] == ">= 85 % of copy" and "note" not in rows[2]


def test_correct_runs_the_device_suite_on_cuda_with_a_worker_per_core():
    argv = correct_stage.pytest_argv(dry_run=False, workers=16)
    assert argv[:2] == ["--device", "cuda"] and argv[argv.index("-m") + 1] == "device"
    assert argv[argv.index("-n") + 1] == "16" and argv[-2:] == ["tests/device", "tests/kernels"]


def test_the_pytest_plugin_writes_each_outcome_and_its_reason(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_passes(): pass\n"
        "def test_fails(): assert 1 == 2, 'one is not two'\n"
        "def test_skips(): pytest.skip('not here')\n"
        "@pytest.fixture\n"
        "def broken(): raise RuntimeError('fixture broke')\n"
        "def test_errors(broken): pass\n")
    rows_path = tmp_path / "rows.jsonl"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "bench.gpu.pytest_rows", "-p", "no:cacheprovider",
                    "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path / "test_sample.py")],
                   env=dict(os.environ, GPU_CHECK_TEST_ROWS=str(rows_path), PYTHONPATH=str(REPO)),
                   cwd=tmp_path, capture_output=True, check=False)
    rows = {row["id"].split("::")[-1]: row for row in map(json.loads, rows_path.read_text().splitlines())}
    assert {name: row["outcome"] for name, row in rows.items()} == {
        "test_passes": "passed", "test_fails": "failed", "test_skips": "skipped", "test_errors": "error"}
    assert "one is not two" in rows["test_fails"]["reason"] and rows["test_skips"]["reason"] == "Skipped: not here"
    assert "fixture broke" in rows["test_errors"]["reason"] and rows["test_passes"]["reason"] == ""
    # a failure carries its traceback's tail (the frame that raised, with its file and line); a pass none
    assert "test_sample.py:3: AssertionError" in rows["test_fails"]["trace"] and "trace" not in rows["test_passes"]
    assert "RuntimeError: fixture broke" in rows["test_errors"]["trace"]


def test_the_wheels_pin_what_the_device_lacks_and_the_install_line_uses_no_index():
    assert wheels.PINNED == ("megatron-core==0.19.2", "en_dtypes==0.0.4")
    argv = wheels.download_argv("python3")
    for flag in ("--only-binary=:all:", "--no-deps", "manylinux2014_x86_64", "manylinux_2_28_x86_64"):
        assert flag in argv
    assert argv[argv.index("--python-version") + 1] == "3.12" and argv[argv.index("-d") + 1] == ".whl"
    line = wheels.install_line()
    assert line.startswith("python3 -m pip install -q --no-index --no-deps --no-compile "
                           "--target /tmp/site .whl/*.whl && ")
    assert "--no-build-isolation --target /tmp/quant . && " in line
    assert line.endswith("export PYTHONPATH=/tmp/site:/tmp/quant:$PWD || exit")
    assert "/.whl/" in (REPO / ".gitignore").read_text().splitlines()


def test_the_kernels_stage_covers_every_format_on_every_path():
    from bench.bench_formats import VARIANTS
    from bench.gpu.kernels_worker import plan
    from megatron.quant.formats import list_formats

    cold = plan(dry_run=False)
    assert cold["device"] == "cuda" and cold["names"] == list_formats() + list(VARIANTS)
    assert cold["modes"] == {"triton": True, "eager": True, "compiled": False}  # compile: single-axis only


def test_the_env_stage_imports_every_dependency_setup_py_names():
    import re

    from bench.gpu.env_probe import DEPENDENCIES

    setup = (REPO / "setup.py").read_text()
    named = set()
    for block in re.findall(r"(?:install_requires=|\"test\": )\[(.*?)\]", setup, re.S):
        named |= {re.split(r"[<>=;\[ ]", requirement)[0].lower().replace("_", "-")
                  for requirement in re.findall(r"\"([^\"]+)\"", block)}
    assert named - {"torch"} <= {name.lower().replace("_", "-") for name in DEPENDENCIES.values()}
