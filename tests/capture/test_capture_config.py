"""SaverConfig: the env-var grammar, Python construction and clear errors for bad values."""
import pytest

from megatron.quant.capture.config import ENV_VARS, IterationWindow, SaverConfig


def test_defaults_when_nothing_is_set():
    cfg = SaverConfig.from_env({})
    assert cfg == SaverConfig()
    assert not cfg.enabled and cfg.save_dir == "./enhanced_tensor_logs" and cfg.mode == "full"
    assert cfg.iterations is None and cfg.layers is None and cfg.max_gb is None


def test_every_variable_is_read():
    cfg = SaverConfig.from_env({
        "TENSOR_SAVE_ENABLED": "True", "TENSOR_SAVE_DIR": "/x", "TENSOR_SAVER_ITERATION": "0-2,10",
        "TENSOR_SAVE_LAYERS": "0,3-4", "TENSOR_SAVE_ROLES": "qkv,fc2", "TENSOR_SAVE_TENSORS": "input",
        "TENSOR_SAVE_RANKS": "1", "TENSOR_SAVE_MICROBATCHES": "0", "TENSOR_SAVE_MODE": "stats",
        "TENSOR_SAVE_MAX_GB": "0.5", "TENSOR_SAVE_QUANTIZED": "yes", "TENSOR_SAVE_EXIT_AFTER": "1",
        "TENSOR_SAVE_QUEUE_MB": "64",
    })
    assert cfg.enabled and cfg.save_dir == "/x" and set(cfg.iterations.members) == {0, 1, 2, 10}
    assert set(cfg.layers) == {0, 3, 4} and cfg.roles == {"qkv", "fc2"} and cfg.tensors == {"input"}
    assert set(cfg.ranks) == {1} and set(cfg.microbatches) == {0} and cfg.mode == "stats" and cfg.max_gb == 0.5
    assert cfg.save_quantized and cfg.exit_after_capture and cfg.queue_mb == 64


def test_python_fields_accept_the_same_grammar():
    cfg = SaverConfig(enabled=True, iterations="every:5", layers=[1, 0], roles="fc1", microbatches="0-1")
    assert cfg.iterations.every == 5 and set(cfg.layers) == {0, 1} and cfg.roles == {"fc1"}
    assert set(cfg.microbatches) == {0, 1}
    assert set(SaverConfig(iterations=7).iterations.members) == {7}


@pytest.mark.parametrize("var, value", [
    ("TENSOR_SAVE_ENABLED", "maybe"), ("TENSOR_SAVER_ITERATION", "every:0"), ("TENSOR_SAVER_ITERATION", "5-3"),
    ("TENSOR_SAVER_ITERATION", "first"), ("TENSOR_SAVER_ITERATION", "1,,2"), ("TENSOR_SAVE_LAYERS", "-1"),
    ("TENSOR_SAVE_LAYERS", "a"), ("TENSOR_SAVE_ROLES", "fc3"), ("TENSOR_SAVE_TENSORS", "input_quantized"),
    ("TENSOR_SAVE_RANKS", "0.5"), ("TENSOR_SAVE_MICROBATCHES", "2-1"), ("TENSOR_SAVE_MODE", "all"),
    ("TENSOR_SAVE_MAX_GB", "0"), ("TENSOR_SAVE_MAX_GB", "nan"), ("TENSOR_SAVE_MAX_GB", "lots"),
    ("TENSOR_SAVE_QUANTIZED", "2"), ("TENSOR_SAVE_EXIT_AFTER", "sure"), ("TENSOR_SAVE_QUEUE_MB", "0"),
])
def test_bad_value_names_variable_value_and_allowed(var, value):
    with pytest.raises(ValueError) as err:
        SaverConfig.from_env({var: value})
    message = str(err.value)
    assert var in message and repr(value) in message and "allowed" in message


def test_bad_python_field_names_the_field():
    with pytest.raises(ValueError, match=r"SaverConfig\.mode='fast'.*full or stats"):
        SaverConfig(mode="fast")
    with pytest.raises(ValueError, match=r"SaverConfig\.roles=.*unknown: attn"):
        SaverConfig(roles=["attn"])


def test_unknown_capture_variable_is_an_error():
    with pytest.raises(ValueError, match="TENSOR_SAVE_LAYER.*known:.*TENSOR_SAVE_LAYERS"):
        SaverConfig.from_env({"TENSOR_SAVE_LAYER": "0"})


def test_every_field_has_an_env_var():
    from dataclasses import fields
    assert len(fields(SaverConfig)) == len(ENV_VARS)


@pytest.mark.parametrize("spec, inside, outside", [
    ("3", [3], [0, 2, 4]), ("0,10,100", [0, 10, 100], [1, 99]), ("2-4", [2, 3, 4], [1, 5]),
    ("every:100", [0, 100, 500], [1, 99, 150]), ("0-1,7", [0, 1, 7], [2, 6, 8]),
])
def test_window_membership(spec, inside, outside):
    window = IterationWindow.parse(spec)
    assert all(i in window for i in inside) and not any(i in window for i in outside)


def test_window_restricted_to_the_run():
    assert set(IterationWindow.parse("0-5").restricted_to(3, 5).members) == {3, 4}
    assert set(IterationWindow.parse("every:4").restricted_to(1, 10).members) == {4, 8}
    assert IterationWindow.parse("2").restricted_to(3, None).is_empty()
    assert IterationWindow.parse("every:4").restricted_to(3, None).every == 4
