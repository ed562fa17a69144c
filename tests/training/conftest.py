"""Shared fixtures: a learnable corpus, tiny HF Llamas, and one spawned process group per world
size that runs every multi-process check of this folder (spawning megatron-core is the cost)."""
import json

import pytest
import torch

from megatron.quant.training import preprocess
from megatron.quant.training.presets import get_preset
from megatron.quant.training.variables import VARIABLES
from tests._dist import run_distributed
from tests.training._corpus_files import CORPUS_TEXTS
from tests.training._workers import run_plan

HF_VOCAB = 300  # not a multiple of 128: exercises vocabulary padding
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
ITERS = 12
PRESETS = ("te-nvfp4", "te-mxfp8", "te-fp8-current", "te-fp8-blockwise", "te-fp8-delayed")
SHORT = ["--train-iters", "2", "--seq-length", "32", "--global-batch-size", "2", "--eval-interval", "2",
         "--log-interval", "1", "--lr-warmup-iters", "0"]
# The FP8 presets' Hopper accumulation model costs tens of times an exact GEMM on the CPU: the runs here that
# test other things (losses, checkpoints, resuming, tensor parallelism) sum exactly; accumulate_hopper trains
# with the model.
EXACT_SUMS = {"CUSTOM_QUANT_ACCUMULATE": "exact"}
# Megatron-LM's flags for delayed scaling with a window of 3 micro-batches (the default window of
# 1 would hide a history that is not restored on resume less well).
DELAYED_FLAGS = ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "3",
                 "--fp8-amax-compute-algo", "max"]


def _exact_sums(preset: str) -> dict[str, str]:
    """EXACT_SUMS for the presets that accumulate as a Hopper tensor core does, else nothing."""
    return EXACT_SUMS if preset in ("te-fp8-current", "te-fp8-delayed") else {}


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> str:
    """A repetitive English corpus (learnable in a few steps), preprocessed with the byte tokenizer."""
    root = tmp_path_factory.mktemp("corpus")
    sentences = ["the quick brown fox jumps over the lazy dog. ", "pack my box with five dozen liquor jugs. "]
    with open(root / "docs.jsonl", "w") as f:
        for i in range(200):
            f.write(json.dumps({"text": sentences[i % 2] * 6}) + "\n")
    [prefix] = preprocess.main(["--input", str(root / "docs.jsonl"), "--output-prefix", str(root / "c"),
                                "--append-eod", "--log-interval", "0"])
    return prefix


@pytest.fixture(scope="session")
def built_corpus(tmp_path_factory):
    """``corpus.build_corpus`` over CORPUS_TEXTS: (source directory, output directory, Corpus)."""
    from megatron.quant.lab.corpus import build_corpus

    source = tmp_path_factory.mktemp("text_files")
    for name, text in CORPUS_TEXTS.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path_factory.mktemp("built_corpus")
    return source, out, build_corpus(out, [source], valid_fraction=0.2, seed=3)


def train_argv(corpus: str, cache: str, *extra: str) -> list[str]:
    return ["--model", "llama-tiny", "--data-path", corpus, "--split", "90,10,0", "--data-cache-path", cache,
            "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", str(ITERS),
            "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "2", "--eval-interval", str(ITERS),
            "--eval-iters", "1", "--log-interval", "4", "--seed", "5", *extra]


def save_tiny_llama(path, *, tie: bool, rope_scaling: dict | None = None) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=HF_VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         rope_theta=50000.0, rms_norm_eps=1e-5, tie_word_embeddings=tie, rope_scaling=rope_scaling)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # HF initialises norms to ones; random ones catch a misplaced norm
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(path, safe_serialization=True)
    return model


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory) -> dict:
    """name -> (directory, tokens, HF logits)."""
    tokens = torch.randint(0, HF_VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    out = {}
    for name, tie, rope in (("tied", True, None), ("untied_llama3_rope", False, LLAMA3_ROPE)):
        path = tmp_path_factory.mktemp(name)
        model = save_tiny_llama(path, tie=tie, rope_scaling=rope)
        with torch.no_grad():
            out[name] = (str(path), tokens, model(tokens).logits)
    return out


def accounting_shapes() -> dict:
    tied = dict(get_preset("llama-tiny"), seq_length=64)
    return {"tied": tied, "untied": dict(tied, untie_embeddings_and_output_weights=True, num_query_groups=4,
                                         ffn_hidden_size=512)}


@pytest.fixture(scope="session")
def stochastic_env(tmp_path_factory) -> dict:
    """CUSTOM_QUANT_RECIPE of an MXFP8 recipe with stochastic rounding on every operand."""
    path = tmp_path_factory.mktemp("recipes") / "mxfp8_sr.yaml"
    path.write_text("format: mxfp8\noptions: {rounding: stochastic}\n")
    return {"CUSTOM_QUANT_RECIPE": str(path)}


@pytest.fixture(scope="session")
def one_rank(corpus, built_corpus, hf_models, stochastic_env, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("one_rank")
    cache, ckpt, sr_ckpt, delayed_ckpt = (str(tmp / name) for name in ("cache", "ckpt", "sr_ckpt", "delayed_ckpt"))
    argv = train_argv(corpus, cache)
    capture_env = {"CUSTOM_QUANT_TYPE": "mxfp8_e4m3", "TENSOR_SAVE_ENABLED": "true",
                   "TENSOR_SAVE_DIR": str(tmp / "tensors"), "TENSOR_SAVER_ITERATION": "2",
                   "TENSOR_SAVE_EXIT_AFTER": "true", "TENSOR_SAVE_ROLES": "qkv"}
    plan = [
        ("fp32", "train", ({}, argv + ["--tensorboard-dir", str(tmp / "tb")])),
        ("capture", "train", (capture_env, argv + ["--eval-interval", "3"])),  # validates inside the window
        ("bf16", "train", ({}, argv + ["--bf16"])),
        ("hifp8", "train", ({"CUSTOM_QUANT_TYPE": "hifp8"}, argv)),
        ("resume_part1", "train", ({}, argv + ["--save", ckpt, "--exit-interval", str(ITERS // 2)])),
        ("resume_part2", "train", ({}, argv + ["--save", ckpt, "--load", ckpt])),
        ("stochastic", "train", (stochastic_env, argv)),
        *((f"preset_{name}", "train", ({"CUSTOM_QUANT_TYPE": name, **_exact_sums(name)}, argv)) for name in PRESETS),
        ("stochastic_part1", "train", (stochastic_env, argv + ["--save", sr_ckpt, "--exit-interval", str(ITERS // 2)])),
        ("stochastic_part2", "train", (stochastic_env, argv + ["--save", sr_ckpt, "--load", sr_ckpt])),
        ("delayed", "train", (EXACT_SUMS, argv + DELAYED_FLAGS)),
        ("delayed_part1", "train", (EXACT_SUMS, argv + DELAYED_FLAGS + ["--save", delayed_ckpt, "--exit-interval",
                                                                str(ITERS // 2)])),
        ("delayed_part2", "train", (EXACT_SUMS, argv + DELAYED_FLAGS + ["--save", delayed_ckpt, "--load",
                                                                        delayed_ckpt])),
        ("load_across_recipes", "load_across_recipes", (ckpt, delayed_ckpt)),
        # Any loss exceeds 1: the run stops at iteration 1 as diverged (tests/training/test_sweep.py).
        ("diverge", "train", ({}, argv + ["--save", str(tmp / "diverged" / "checkpoints"), "--tensorboard-dir",
                                          str(tmp / "diverged" / "tensorboard"), "--divergence-threshold", "1"])),
        # te-fp8-current as it comes, with TE's Hopper accumulation (its exact sums: preset_te-fp8-current): two
        # short steps (tests/training/test_accumulate_training.py).
        ("accumulate_hopper", "train", ({"CUSTOM_QUANT_TYPE": "te-fp8-current"}, argv + SHORT)),
        # One step on the corpus builder's held-out split (tests/training/test_corpus.py).
        ("built_corpus", "train", ({}, train_argv(built_corpus[2].data_path, cache) + [
            "--split", built_corpus[2].split, "--train-iters", "1", "--lr-warmup-iters", "0", "--eval-interval", "1",
            "--tensorboard-dir", str(tmp / "corpus_tb")])),
    ]
    plan += [(f"hf_{name}", "hf_logits", (path, tokens)) for name, (path, tokens, _) in hf_models.items()]
    plan += [(f"accounting_{name}", "model_accounting", (shape, 2)) for name, shape in accounting_shapes().items()]
    results = run_distributed(run_plan, 1, plan, timeout=600)[0]
    results.update(checkpoint_dir=ckpt, tensorboard_dir=str(tmp / "tb"), tensor_dir=str(tmp / "tensors"),
                   diverged_run_dir=str(tmp / "diverged"), corpus_tensorboard_dir=str(tmp / "corpus_tb"))
    return results


@pytest.fixture(scope="session")
def two_ranks(corpus, hf_models, stochastic_env, tmp_path_factory) -> list[dict]:
    cache = str(tmp_path_factory.mktemp("two_ranks") / "cache")
    argv = train_argv(corpus, cache)
    path, tokens, _ = hf_models["untied_llama3_rope"]
    plan = [
        ("tp2", "train", ({}, argv + ["--tensor-model-parallel-size", "2"])),
        ("dp2", "train", ({}, argv)),
        ("stochastic_tp2", "train", (stochastic_env, argv + ["--tensor-model-parallel-size", "2"])),
        ("delayed_tp2", "train", (EXACT_SUMS, argv + DELAYED_FLAGS + ["--tensor-model-parallel-size", "2"])),
        ("hf_tp2", "hf_logits", (path, tokens)),
    ]
    return run_distributed(run_plan, 2, plan, timeout=600)


@pytest.fixture
def clean_env(monkeypatch):
    """No run variable (CUSTOM_QUANT_*, TENSOR_SAVE_*) of the calling shell reaches the test."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch
