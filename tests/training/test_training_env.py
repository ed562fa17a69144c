import os

import pytest

from megatron.quant.settings.environment import scoped_environ


def test_scoped_environ_restores_previous_values_even_on_error(monkeypatch):
    monkeypatch.setenv("CUSTOM_QUANT_TYPE", "bf16")
    monkeypatch.delenv("TENSOR_SAVE_DIR", raising=False)
    with pytest.raises(RuntimeError):
        with scoped_environ({"CUSTOM_QUANT_TYPE": "mxfp4", "TENSOR_SAVE_DIR": "/tmp/x"}):
            assert os.environ["CUSTOM_QUANT_TYPE"] == "mxfp4" and os.environ["TENSOR_SAVE_DIR"] == "/tmp/x"
            raise RuntimeError("inside")
    assert os.environ["CUSTOM_QUANT_TYPE"] == "bf16" and "TENSOR_SAVE_DIR" not in os.environ
