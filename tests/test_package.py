"""The package installs into megatron-core's namespace without hiding it."""
import importlib
import pathlib


def test_namespace_keeps_megatron_core_importable():
    core = importlib.import_module("megatron.core")
    quant = importlib.import_module("megatron.quant")
    assert hasattr(core, "parallel_state")
    assert quant.__version__
    repo = pathlib.Path(__file__).resolve().parents[1]
    assert not (repo / "megatron" / "__init__.py").exists()
