"""Training data: megatron-core GPT datasets (indexed ``.bin/.idx`` or mock) and batch slicing.

Batches are a pure function of (iteration, micro-batch, data-parallel rank), laid out as
Megatron-LM's pretraining sampler does, so a resumed run reads exactly the samples an
uninterrupted run would have.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from megatron.quant.training.dataset_files import check_indexed_dataset
from megatron.quant.training.tokenizers import Tokenizer


@dataclass(frozen=True)
class BatchLayout:
    micro_batch_size: int
    global_batch_size: int
    data_parallel_size: int

    def first_sample(self, iteration: int, microbatch: int, dp_rank: int) -> int:
        """Global index of the first sample of this rank's micro-batch (Megatron's sampler order)."""
        per_step = self.micro_batch_size * self.data_parallel_size
        return iteration * self.global_batch_size + microbatch * per_step + dp_rank * self.micro_batch_size


def _weight(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_blend(data_path: Sequence[str] | None) -> tuple[list[str], list[float] | None] | None:
    """``[W1] P1 [W2 P2 ...]`` -> (prefixes, weights); ValueError on a bad weight or an unpaired list."""
    from megatron.core.datasets.utils import get_blend_from_list

    if data_path is None:
        return None
    usage = "give PREFIX, PREFIX1 PREFIX2 ... or W1 PREFIX1 W2 PREFIX2 ... with positive weights"
    if len(data_path) % 2 == 0:
        for text in data_path[::2]:
            weight = _weight(text)
            if weight is None:
                raise ValueError(f"--data-path: {text!r} is not a weight; {usage}")
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(f"--data-path: weight {text} is not a positive finite number; {usage}")
    elif len(data_path) > 1 and any(_weight(text) is not None for text in data_path):
        raise ValueError(f"--data-path: {len(data_path)} values with weights among them: weights and prefixes "
                         f"come in pairs; {usage}")
    return get_blend_from_list(list(data_path))


def check_data(data_path: Sequence[str] | None) -> tuple[list[str], list[float] | None] | None:
    """``parse_blend``, then every prefix checked as an intact, non-empty indexed dataset
    (DatasetError, a ValueError, naming the file): what a run or a study checks before it starts."""
    blend = parse_blend(data_path)
    for prefix in blend[0] if blend is not None else ():
        check_indexed_dataset(prefix)
    return blend


def build_datasets(tokenizer: Tokenizer, *, seq_length: int, seed: int, data_path: Sequence[str] | None,
                   split: str, num_samples: Sequence[int], cache_path: str | None = None) -> list:
    """(train, valid, test) GPT datasets; mock data when ``data_path`` is None.

    ``num_samples``: samples per split. Must run on every rank (megatron-core builds on
    rank 0 first, then the others read its cached indices).
    """
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset

    blend = check_data(data_path)
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, blend=blend,
        split=split if blend is not None else "1,0,0", tokenizer=tokenizer,
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=False, path_to_cache=cache_path, mid_level_dataset_surplus=0.005)
    cls = MockGPTDataset if blend is None else GPTDataset
    return BlendedMegatronDatasetBuilder(cls, list(num_samples), lambda: True, config).build()


def get_batch(dataset, layout: BatchLayout, iteration: int, microbatch: int, dp_rank: int) -> dict[str, torch.Tensor]:
    """This rank's micro-batch: ``tokens``, ``labels``, ``loss_mask``, ``position_ids`` [b, s]."""
    start = layout.first_sample(iteration, microbatch, dp_rank)
    samples = [dataset[(start + j) % len(dataset)] for j in range(layout.micro_batch_size)]
    return {key: torch.stack([s[key] for s in samples]) for key in ("tokens", "labels", "loss_mask", "position_ids")}
