"""Installs ``megatron.quant`` into the ``megatron`` namespace that megatron-core owns.

There is deliberately no ``megatron/__init__.py``: it would shadow megatron-core.
"""
from setuptools import find_namespace_packages, setup

setup(
    name="megatron-quant",
    version="0.1.0",
    description="Fake-quantized GEMM operands (HiFloat8, MX, NVFP4, FP8) for megatron-core Llama training, "
                "with tensor capture and analysis",
    license="Apache-2.0",  # as megatron-core and Transformer Engine: LICENSE
    # Tested on 3.11 (megatron-core 0.16) and 3.12 (megatron-core 0.19): docs/training.md#megatron-core-versions.
    python_requires=">=3.11",
    packages=find_namespace_packages(include=["megatron.quant", "megatron.quant.*"]),
    install_requires=[
        # megatron-core's own floor; the CPU build comes from PyTorch's CPU index (README).
        "torch>=2.6,<2.14",
        # 0.17 and later need Python 3.12; the differences are bridged in megatron/quant/compat.py.
        "megatron-core>=0.16,<0.17; python_version < '3.12'",
        "megatron-core>=0.16,<0.20; python_version >= '3.12'",
        # megatron-core 0.19 imports Triton when it is imported, without declaring it (compat.core_imports_triton).
        "triton>=3.0; python_version >= '3.12' and platform_system == 'Linux'",
        "numpy>=1.24",
        "pyyaml>=6",
        "matplotlib>=3.7",
        "scipy>=1.10",
        "tensorboard>=2.14",
        "safetensors>=0.4",
        "tqdm>=4.60",
        # megatron-core's checkpoint writer processes need it.
        "psutil>=5.9",
    ],
    extras_require={
        "test": [
            "pytest>=7",
            "pytest-xdist>=3",
            "ml_dtypes>=0.5",
            "en_dtypes>=0.0.4",
            "transformers>=4.45",
            # The kernel tests run Triton's interpreter on CPU; its wheel depends on nothing (no CUDA packages).
            "triton>=3.0; platform_system == 'Linux'",
            # tests/test_lint.py: pyflakes, import order, line length (pyproject.toml's [tool.ruff]).
            "ruff>=0.6",
            # The oracle of the Hopper FP8 accumulation model (tests/formats/test_hopper_accumulation.py); tests only.
            "mmaemu==0.1.0",
        ],
        # --wandb-project: the same scalars as TensorBoard, to Weights & Biases (WANDB_MODE=offline works offline).
        "wandb": ["wandb>=0.16"],
        # Transformer Engine needs CUDA to build; it is only used for DTYPE=fp8 on GPUs.
        "gpu": ["transformer_engine[pytorch]>=2.0"],
    },
    entry_points={"console_scripts": ["megatron-quant-train=megatron.quant.training.main:main"]},
)
