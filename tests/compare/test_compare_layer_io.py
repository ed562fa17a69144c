"""save_first_layer_io end to end on the llama-tiny preset: each mode moves the layer output from
fp32 as its format implies, the .npz and _stats.json agree, the screen report has the original's
fields, and bad arguments are clear errors."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from megatron.quant import formats
from megatron.quant.compare import report, run_layer_io
from megatron.quant.compare.modes import resolve_modes
from megatron.quant.recipes.sets import ESSENTIAL

REPO = Path(__file__).resolve().parents[2]
SEQ = 16


def _run(tmp_path: Path, *extra: str) -> tuple[dict, dict]:
    output = tmp_path / "io.npz"
    args = run_layer_io.build_parser().parse_args(["--output_file", str(output), "--seq_len", str(SEQ), *extra])
    stats = run_layer_io.run(args, log=lambda line: None)
    with np.load(output) as data:
        arrays = dict(data)
    assert json.loads(report.stats_path_for(output).read_text()) == json.loads(json.dumps(stats))
    return arrays, stats


@pytest.fixture(scope="module")
def essential(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("essential")
    arrays, stats = _run(tmp, "--modes", "essential")
    return {"arrays": arrays, "stats": stats, "dir": tmp}


def _rel(arrays, mode, name):
    diff = arrays[f"mode_{mode}_{name}"].astype(np.float64) - arrays[f"mode_fp32_{name}"]
    return np.linalg.norm(diff) / np.linalg.norm(arrays[f"mode_fp32_{name}"])


def test_single_layer_keys_are_the_originals(essential):
    assert sorted(essential["arrays"]) == sorted(f"mode_{m}_{io}" for m in ESSENTIAL for io in ("input", "output"))
    assert essential["arrays"]["mode_fp32_output"].shape == (1, SEQ, 256)  # batch-first, hidden 256


def test_each_mode_moves_the_output_as_its_format_implies(essential):
    arrays = essential["arrays"]
    # Formats run the model in fp32 and quantize only GEMM operands: layer 0's input (the
    # embedding) is untouched, and bf16's input is the fp32 one rounded to bf16.
    for mode in ("hifp8", "mxfp8", "mxfp4"):
        np.testing.assert_array_equal(arrays[f"mode_{mode}_input"], arrays["mode_fp32_input"])
    rounded = torch.from_numpy(arrays["mode_fp32_input"]).bfloat16().float().numpy()
    np.testing.assert_array_equal(arrays["mode_bf16_input"], rounded)
    bf16, mxfp8, mxfp4 = (_rel(arrays, m, "output") for m in ("bf16", "mxfp8", "mxfp4"))
    assert 0 < bf16 < mxfp8 < mxfp4
    assert mxfp4 > 10 * bf16


def test_fp32_against_itself_is_exactly_zero(essential, tmp_path):
    again, _ = _run(tmp_path, "--modes", "fp32")
    np.testing.assert_array_equal(again["mode_fp32_output"], essential["arrays"]["mode_fp32_output"])
    assert "vs_reference" not in essential["stats"]["modes"]["fp32"]["output"]


def test_npz_and_json_agree(essential):
    arrays, stats = essential["arrays"], essential["stats"]
    for mode, tensors in stats["modes"].items():
        for name, entry in tensors.items():
            x = arrays[f"mode_{mode}_{name}"].astype(np.float64)
            assert entry["shape"] == list(x.shape)
            assert entry["first_10"] == x.reshape(-1)[:10].tolist()
            assert entry["mean"] == pytest.approx(x.mean(), rel=1e-9, abs=1e-12)
            assert entry["std"] == pytest.approx(x.std(), rel=1e-9)
            assert (entry["min"], entry["max"]) == (x.min(), x.max())
            if mode == "fp32":
                continue
            diff = x - arrays[f"mode_fp32_{name}"]
            errors = entry["vs_reference"]
            assert errors["mse"] == pytest.approx(np.mean(diff ** 2), rel=1e-9, abs=1e-30)
            assert errors["mae"] == pytest.approx(np.mean(np.abs(diff)), rel=1e-9, abs=1e-30)
            assert errors["max_abs_error"] == np.abs(diff).max()


def test_screen_report_has_the_original_fields(essential):
    text = report.format_screen_report(essential["stats"])
    blocks = re.split(r"={98}\nMODE (\S+)\n={98}\n", text)[1:]
    assert blocks[0::2] == list(ESSENTIAL)
    for mode, block in zip(blocks[0::2], blocks[1::2]):
        for io in ("input", "output"):
            entry = essential["stats"]["modes"][mode][io]
            match = re.search(rf"{io.upper()} \(Shape: \[1, {SEQ}, 256\]\):\n  First 10 values: \[(.*)\]\n"
                              r"  Mean: (\S+)\n  Std:  (\S+)\n  Range: \[(\S+), (\S+)\]", block)
            assert match, block
            shown = [float(v.strip("' ")) for v in match.group(1).split(",")]
            # Six decimals, as the original prints them.
            assert shown == pytest.approx(entry["first_10"], abs=5.1e-7)
            assert float(match.group(2)) == pytest.approx(entry["mean"], abs=5.1e-7)
            assert float(match.group(3)) == pytest.approx(entry["std"], abs=5.1e-7)
            extremes = (float(match.group(4)), float(match.group(5)))
            assert extremes == pytest.approx((entry["min"], entry["max"]), abs=5.1e-7)
        assert ("vs fp32: MSE" in block) == (mode != "fp32")


def test_difference_histograms_are_written(essential):
    assert sorted(p.name for p in essential["dir"].glob("*.png")) == ["io_diff_input.png", "io_diff_output.png"]


def test_linear_submodule_output_is_the_quantized_matmul(tmp_path):
    arrays, _ = _run(tmp_path, "--modes", "mxfp8", "--submodule", "self_attention.linear_qkv", "--no_plots")
    from megatron.quant.training.loading import load_model

    model, _ = load_model("preset:llama-tiny", resolve_modes(["fp32"])[0].recipe, seed=1234)
    weight = model.decoder.layers[0].self_attention.linear_qkv.weight.detach()
    x = torch.from_numpy(arrays["mode_mxfp8_input"])
    # fprop Y = X W^T with X and W both blocked along in_features (the last axis of each).
    expected = formats.quantize(x, "mxfp8", axis=-1) @ formats.quantize(weight, "mxfp8", axis=-1).T
    torch.testing.assert_close(torch.from_numpy(arrays["mode_mxfp8_output"]), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(arrays["mode_mxfp8_input"], arrays["mode_fp32_input"])


def test_several_layers_and_a_submodule_get_layer_keys(tmp_path):
    arrays, stats = _run(tmp_path, "--modes", "mxfp4", "--layers", "0", "-1", "--submodule", "mlp", "--no_plots")
    assert sorted(arrays) == sorted(f"mode_{m}_L{layer}_mlp_{io}" for m in ("fp32", "mxfp4")
                                    for layer in (0, 1) for io in ("input", "output"))
    assert stats["targets"] == {"L0_mlp": "decoder.layers.0.mlp", "L1_mlp": "decoder.layers.1.mlp"}


@pytest.mark.parametrize("extra, message", [
    (["--modes", "fp32", "mxfp9"], "unknown mode 'mxfp9'; valid: presets"),
    (["--layers", "2"], "--layers 2 is out of range: the model has 2 layers"),
    (["--layers", "-3"], "--layers -3 is out of range"),
    (["--model", "/nonexistent/llama"], "--model '/nonexistent/llama': no such directory"),
    (["--submodule", "attn"], "no module 'decoder.layers.0.attn'"),
    (["--prompt", "hello"], "--prompt needs --tokenizer"),
    (["--seq_len", "0"], "--seq_len must be a positive integer, got 0"),
    (["--output_file", "x.txt"], "--output_file 'x.txt' must end in .npz"),
])
def test_bad_arguments_are_clear_errors(tmp_path, capsys, extra, message):
    code = run_layer_io.main(["--output_file", str(tmp_path / "x.npz"), "--seq_len", "4", "--no_plots",
                              "--modes", "fp32", *extra])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.npz").exists()


def test_shell_script_expands_presets_and_passes_options(tmp_path):
    """Run where a user runs it (a repository's root): everything lands in one folder, and the
    console starts with the run, not with megatron-core's known start-up notices."""
    done = subprocess.run(["bash", str(REPO / "script" / "capture_first_layer.sh"), "essential", "--seq_len", "8"],
                          cwd=tmp_path, capture_output=True, text=True, env=_env())
    assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["first_layer_io"]
    output = tmp_path / run_layer_io.DEFAULT_OUTPUT
    assert sorted(p.name for p in output.parent.iterdir()) == sorted(
        [output.name, report.stats_path_for(output).name, "first_layer_io_all_modes_diff_input.png",
         "first_layer_io_all_modes_diff_output.png"])
    stats = json.loads(report.stats_path_for(output).read_text())
    assert list(stats["modes"]) == list(ESSENTIAL) and stats["seq_len"] == 8
    assert "MODE mxfp4" in done.stdout and "First 10 values:" in done.stdout
    assert "Apex" not in done.stderr and "deprecated" not in done.stderr, done.stderr  # megatron-core's known notices


def _env() -> dict:
    import os

    # init_parallel in this process exported a one-process world (RANK, MASTER_PORT, ...); the
    # script must start its own.
    launcher = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
    env = {key: value for key, value in os.environ.items() if key not in launcher}
    return {**env, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}


def test_hf_directory_and_prompt_match_transformers(tmp_path):
    """A local Hugging Face Llama and a text prompt: layer 0's fp32 output equals transformers'
    own hidden state after layer 0 on the same tokens (an independent implementation)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["<eos>", "<unk>", "the", "cat", "sat", "on", "a", "mat"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    hf_dir = tmp_path / "hf"
    PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", unk_token="<unk>").save_pretrained(hf_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
    hf_model = LlamaForCausalLM(config).eval()
    hf_model.save_pretrained(hf_dir, safe_serialization=True)

    arrays, stats = _run(tmp_path, "--model", str(hf_dir), "--prompt", "the cat sat on a mat",
                         "--modes", "bf16", "--no_plots")
    assert stats["input"] == {"kind": "prompt", "prompt": "the cat sat on a mat", "tokenizer": str(hf_dir)}
    tokens = torch.tensor([[2, 3, 4, 5, 6, 7]])
    with torch.no_grad():
        hidden = hf_model(tokens, output_hidden_states=True).hidden_states
    torch.testing.assert_close(torch.from_numpy(arrays["mode_fp32_input"]), hidden[0], rtol=0, atol=0)
    torch.testing.assert_close(torch.from_numpy(arrays["mode_fp32_output"]), hidden[1], rtol=1e-4, atol=1e-5)
