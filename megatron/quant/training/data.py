"""Training data: megatron-core GPT datasets (indexed ``.bin/.idx`` or mock) and batch slicing.

Batches are a pure function of (iteration, micro-batch, data-parallel rank), laid out as
Megatron-LM's pretraining sampler does, so a resumed run reads exactly the samples an
uninterrupted run would have.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch

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


def parse_blend(data_path: Sequence[str] | None) -> tuple[list[str], list[float] | None] | None:
    """``[W1] P1 [W2 P2 ...]`` -> (prefixes, weights); ValueError on a bad weight."""
    from megatron.core.datasets.utils import get_blend_from_list

    if data_path is None:
        return None
    if len(data_path) % 2 == 0:
        for weight in data_path[::2]:
            try:
                float(weight)
            except ValueError:
                raise ValueError(f"--data-path: {weight!r} is not a weight; give PREFIX or "
                                 "W1 PREFIX1 W2 PREFIX2 ...") from None
    return get_blend_from_list(list(data_path))


def build_datasets(tokenizer: Tokenizer, *, seq_length: int, seed: int, data_path: Sequence[str] | None,
                   split: str, num_samples: Sequence[int], cache_path: str | None = None) -> list:
    """(train, valid, test) GPT datasets; mock data when ``data_path`` is None.

    ``num_samples``: samples per split. Must run on every rank (megatron-core builds on
    rank 0 first, then the others read its cached indices).
    """
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset

    blend = parse_blend(data_path)
    if blend is not None:
        missing = [p for p in blend[0] if not (os.path.isfile(p + ".bin") and os.path.isfile(p + ".idx"))]
        if missing:
            raise FileNotFoundError(f"--data-path: no indexed dataset (.bin + .idx) at {missing}")
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
