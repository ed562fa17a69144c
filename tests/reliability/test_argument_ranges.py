"""Training flags out of their range are refused by ``validate_args`` (one line naming the flag,
the value and what is allowed) before anything divides by them, seeds a generator with them or
trains into a NaN with them; recompute flags in combinations Megatron-LM refuses are refused."""
import pytest

from megatron.quant.training.arguments import MAX_SEED, ArgumentError, parse_args, validate_args

TINY = ["--model", "llama-tiny", "--mock-data", "--train-iters", "2"]


@pytest.mark.parametrize("extra, message", [
    # zero or negative sizes and divisors: before, a ZeroDivisionError or a late failure
    (["--tensor-model-parallel-size", "0"], "--tensor-model-parallel-size must be positive, got 0"),
    (["--pipeline-model-parallel-size", "-1"], "--pipeline-model-parallel-size must be positive, got -1"),
    (["--group-query-attention", "--num-query-groups", "0"], "--num-query-groups must be positive, got 0"),
    (["--make-vocab-size-divisible-by", "0"], "--make-vocab-size-divisible-by must be positive, got 0"),
    (["--vocab-size", "-5"], "--vocab-size must be positive, got -5"),
    # seeds numpy's generator (megatron-core's dataset shuffle) cannot take
    (["--seed", "-1"], f"--seed must be between 0 and {MAX_SEED}"),
    (["--seed", str(2**32)], f"got {2**32}"),
    # probabilities outside [0, 1], betas outside [0, 1)
    (["--attention-dropout", "1.5"], "--attention-dropout must be a number in [0, 1], got 1.5"),
    (["--hidden-dropout", "-0.1"], "--hidden-dropout must be a number in [0, 1]"),
    (["--adam-beta2", "1"], "--adam-beta2 must be a number in [0, 1)"),
    # negative eps, weight decay; NaN and infinite values
    (["--adam-eps=-1e-8"], "--adam-eps must be a finite number >= 0, got -1e-08"),
    (["--weight-decay", "-0.1"], "--weight-decay must be a finite number >= 0"),
    (["--norm-epsilon", "0"], "--norm-epsilon must be a finite number > 0"),
    (["--lr", "nan"], "--lr must be a finite number >= 0, got nan"),
    (["--clip-grad", "inf"], "--clip-grad must be a finite number >= 0, got inf"),
    (["--init-method-std", "-0.02"], "--init-method-std must be a finite number > 0"),
    # data blend weights: negative, NaN, zero, or an odd list with weights in it
    (["--mock-data", "--data-path", "-1", "a", "2", "b"], "--data-path: weight -1 is not a positive finite number"),
    (["--data-path", "nan", "a"], "weight nan is not a positive finite number"),
    (["--data-path", "0.3", "a", "0.7"], "3 values with weights among them: weights and prefixes come in pairs"),
])
def test_out_of_range_flags_are_refused(extra, message):
    argv = [a for a in TINY if a != "--mock-data"] if "--data-path" in extra else TINY
    extra = [a for a in extra if a != "--mock-data"]
    with pytest.raises(ArgumentError) as error:
        validate_args(parse_args(argv + extra), 1, cuda=False)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_boundary_values_are_accepted():
    args = validate_args(parse_args(TINY + ["--seed", str(MAX_SEED), "--attention-dropout", "1", "--adam-eps", "0",
                                            "--weight-decay", "0", "--clip-grad", "0"]), 1, cuda=False)
    assert args.seed == MAX_SEED


@pytest.mark.parametrize("extra, message", [
    (["--recompute-method", "block"], "need --recompute-granularity full"),  # method without granularity
    (["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "5"],
     "between 1 and the layers per pipeline stage (2), got 5"),  # more recomputed layers than layers
    (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "-1"],
     "got -1"),
    (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "0"], "got 0"),
    (["--recompute-granularity", "selective", "--recompute-method", "uniform"],
     "--recompute-method uniform is not supported with --recompute-granularity selective"),
    (["--recompute-num-layers", "-3"], "need --recompute-granularity full"),
])
def test_contradictory_recompute_flags_are_refused_as_megatron_lm_does(extra, message):
    with pytest.raises(ArgumentError) as error:
        validate_args(parse_args(TINY + extra), 1, cuda=False)
    assert message in str(error.value)
