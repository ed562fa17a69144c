"""Every Megatron-LM flag has an answer: the table holds against the trainer's parser, ignored flags parse
and print a notice, refused ones stop in one line saying what to use, docs/training.md renders the table,
and the stock Megatron-LM Llama 3 launch line (tiny sizes, mock data, CPU) checks unchanged, each ignored flag
with its notice (tests/test_from_megatron_lm.py trains it, as docs/from-megatron-lm.md shows it)."""
import argparse
import re
from pathlib import Path

import pytest

from megatron.quant.training import megatron_lm_flags
from megatron.quant.training.arguments import ArgumentError, build_parser, parse_args, validate_args
from megatron.quant.training.main import main
from megatron.quant.training.megatron_lm_flags import ANSWERS, render_markdown

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model", "llama-tiny", "--mock-data", "--train-iters", "2"]


def stock_llama3_line(tmp_path: Path) -> list[str]:
    """Megatron-LM core_v0.19.0 examples/llama/train_llama3_8b_h100_fp8.sh's launch line, flag for flag and in
    its order (DTYPE fp8, MOCK tokenizer and data), with tiny sizes; the shell hands its array's
    "--split '99,1,0'" over with the quotes."""
    ckpt, tb, cache = (str(tmp_path / name) for name in ("ckpt", "tb", "cache"))
    return [
        "--use-mcore-models", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
        "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "16",
        "--seq-length", "32", "--max-position-embeddings", "32", "--position-embedding-type", "rope",
        "--rotary-base", "1000000", "--rotary-percent", "1.0", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
        "--swiglu", "--normalization", "RMSNorm", "--init-method-std", "0.0134", "--attention-backend", "fused",
        "--apply-layernorm-1p", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
        "--micro-batch-size", "1", "--global-batch-size", "2", "--train-samples", "4", "--lr-decay-samples", "4",
        "--lr-warmup-samples", "2", "--lr", "0.00015", "--min-lr", "0.00001", "--decoupled-lr", "5.0e-4",
        "--decoupled-min-lr", "4.5e-5", "--lr-decay-style", "cosine", "--clip-grad", "1.0", "--weight-decay", "0.1",
        "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--bf16", "--grad-reduce-in-bf16", "--cross-entropy-loss-fusion",
        "--calculate-per-token-loss", "--manual-gc", "--empty-unused-memory-level", "1", "--exit-duration-in-mins",
        "235", "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
        "--fp8-format", "hybrid", "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max",
        "--fp8-param-gather", "--tensor-model-parallel-size", "1", "--context-parallel-size", "1",
        "--sequence-parallel", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "256",
        "--data-cache-path", cache, "--tiktoken-pattern", "v2", "--split", "'99,1,0'",
        "--no-create-attention-mask-in-dataloader", "--no-mmap-bin-files", "--num-workers", "1",
        "--log-interval", "1", "--eval-iters", "1", "--eval-interval", "100", "--save-interval", "1000",
        "--log-throughput", "--profile", "--profile-step-start", "4", "--profile-step-end", "6",
        "--ckpt-format", "torch_dist", "--distributed-timeout-minutes", "60", "--save", ckpt, "--load", ckpt,
        "--tensorboard-dir", tb]


def test_the_table_holds_against_the_parser():
    """Honoured flags are the parser's own; every other Megatron-LM flag is parsed as the table answers it."""
    parser = build_parser()
    own = {option: action.dest for action in parser._actions for option in action.option_strings}
    for flag, answer in ANSWERS.items():
        assert flag in own, f"{flag} is unknown to the trainer"
        assert (answer.kind == "honoured") == (not own[flag].startswith("megatron_lm ")), flag
    assert len(ANSWERS) == 847  # Megatron-LM core_v0.19.0's option strings, counted from its parser with Kitchen


def test_a_flag_answered_twice_or_under_a_bad_header_is_refused():
    with pytest.raises(ValueError, match="--profile answered twice"):
        megatron_lm_flags._parse("ignored | logging and profiling | why\n--profile\n"
                                 "refused | logging and profiling | use that\n--profile\n")
    with pytest.raises(ValueError, match="bad block header"):
        megatron_lm_flags._parse("maybe | model | why\n--profile\n")


def test_ignored_flags_parse_with_their_values_and_give_one_notice_each():
    args = parse_args([*TINY, "--use-mcore-models", "--transformer-impl", "local", "--attention-backend", "local",
                       "--distributed-backend", "gloo", "--recompute-modules", "core_attn", "mlp"])
    assert [notice.split(" ignored: ")[0] for notice in args.notices] == [
        f"{flag} (Megatron-LM)" for flag in ("--use-mcore-models", "--transformer-impl", "--attention-backend",
                                             "--distributed-backend", "--recompute-modules")]
    assert "the lab's layers are the implementation" in args.notices[1]
    assert not any(key.startswith("megatron_lm ") for key in vars(args))


@pytest.mark.parametrize("flags, message", [
    (["--optimizer", "sgd"], r"--optimizer \(Megatron-LM\) is refused: the trainer's optimizer is Adam\(W\)"),
    (["--multi-latent-attention"], r"--multi-latent-attention \(Megatron-LM\) is refused: a model feature Llama"),
    (["--kv-channels", "48"], r"--kv-channels 48 must be --hidden-size / --num-attention-heads = 64"),
    (["--context-parallel-size", "2"], "--context-parallel-size 2: .* allowed: 1"),
    (["--train-samples", "8"], "give one of --train-iters and --train-samples"),
], ids=["optimizer", "mla", "kv_channels", "context_parallel", "iters_and_samples"])
def test_refused_flags_stop_in_one_line_saying_what_to_use(flags, message):
    with pytest.raises(ArgumentError, match=message) as error:
        validate_args(parse_args([*TINY, *flags]), 1, cuda=False)
    assert "\n" not in str(error.value)


def test_samples_become_iterations_of_the_global_batch():
    argv = ["--model", "llama-tiny", "--mock-data", "--global-batch-size", "4", "--train-samples", "41",
            "--lr-decay-samples", "38", "--lr-warmup-samples", "9"]
    args = validate_args(parse_args(argv), 1, cuda=False)
    assert (args.train_iters, args.lr_decay_iters, args.lr_warmup_iters) == (10, 9, 2)


def test_megatron_lms_quiet_adjustments_are_made_with_a_notice():
    args = validate_args(parse_args([*TINY, "--sequence-parallel", "--use-distributed-optimizer", "--split",
                                     "'99,1,0'"]), 1, cuda=False)
    assert not args.sequence_parallel and not args.use_distributed_optimizer and args.split == "99,1,0"
    assert [notice.split(" ignored")[0] for notice in args.notices] == ["--sequence-parallel",
                                                                        "--use-distributed-optimizer"]


def test_docs_training_renders_the_table():
    doc = (REPO / "docs" / "training.md").read_text()
    begin, end = "<!-- megatron-lm flags: begin -->\n", "<!-- megatron-lm flags: end -->"
    assert doc[doc.index(begin) + len(begin):doc.index(end)] == render_markdown(), \
        "regenerate: python -m megatron.quant.training.megatron_lm_flags"


def test_the_stock_llama3_line_checks_with_one_notice_per_ignored_flag(clean_env, tmp_path, capsys):
    assert main([*stock_llama3_line(tmp_path), "--check-args"]) == []
    notices = re.findall(r"^megatron-quant-train: notice: (--[\w-]+)", capsys.readouterr().out, re.M)
    ignored = {"--use-mcore-models", "--attention-backend", "--apply-layernorm-1p", "--decoupled-lr",
               "--decoupled-min-lr", "--grad-reduce-in-bf16", "--cross-entropy-loss-fusion",
               "--calculate-per-token-loss", "--manual-gc", "--empty-unused-memory-level", "--exit-duration-in-mins",
               "--overlap-grad-reduce", "--overlap-param-gather", "--fp8-param-gather", "--tiktoken-pattern",
               "--no-create-attention-mask-in-dataloader", "--no-mmap-bin-files", "--num-workers", "--log-throughput",
               "--profile", "--profile-step-start", "--profile-step-end", "--ckpt-format",
               "--distributed-timeout-minutes"}
    adjusted = {"--sequence-parallel", "--use-distributed-optimizer", "--fp8-format"}
    assert sorted(notices) == sorted(ignored | adjusted)


def test_the_table_parses_each_arity_as_megatron_lm_does():
    parser = argparse.ArgumentParser()
    megatron_lm_flags.add_answered_flags(parser)
    args = parser.parse_args(["--iterations-to-skip", "3", "4", "--rampup-batch-size", "1", "2", "3", "--profile"])
    assert vars(args) == {"megatron_lm --iterations-to-skip": ["3", "4"],
                          "megatron_lm --rampup-batch-size": ["1", "2", "3"], "megatron_lm --profile": True}
