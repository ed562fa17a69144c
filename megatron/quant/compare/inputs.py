"""The one fixed token batch every mode sees: seeded random tokens, tokens from an indexed
dataset, or a text prompt through a tokenizer."""
from __future__ import annotations

from pathlib import Path

import torch


def seeded_tokens(vocab_size: int, batch_size: int, seq_len: int, seed: int) -> torch.Tensor:
    """Uniform random token ids [batch, seq] from a private generator (the global RNG is untouched)."""
    _check_positive(batch_size=batch_size, seq_len=seq_len)
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch_size, seq_len), generator=generator)


def tokens_from_dataset(path_prefix: str, vocab_size: int, batch_size: int, seq_len: int,
                        offset: int = 0) -> torch.Tensor:
    """``batch_size`` consecutive windows of ``seq_len`` tokens from a megatron indexed dataset
    (``PREFIX.bin``/``PREFIX.idx``), read as one token stream starting at token ``offset``."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    _check_positive(batch_size=batch_size, seq_len=seq_len)
    prefix = str(path_prefix).removesuffix(".bin").removesuffix(".idx")
    if not (Path(prefix + ".bin").is_file() and Path(prefix + ".idx").is_file()):
        raise FileNotFoundError(f"--data_path {path_prefix!r}: expected {prefix}.bin and {prefix}.idx")
    dataset = IndexedDataset(prefix)
    needed = offset + batch_size * seq_len
    chunks, have = [], 0
    for index in range(len(dataset)):
        if have >= needed:
            break
        document = torch.as_tensor(dataset[index].astype("int64"))
        chunks.append(document)
        have += document.numel()
    if have < needed:
        raise ValueError(f"--data_path {path_prefix!r} holds {have} tokens; "
                         f"{needed} needed (offset {offset} + batch {batch_size} x seq_len {seq_len})")
    stream = torch.cat(chunks)[offset:needed]
    return _checked_vocab(stream.view(batch_size, seq_len), vocab_size, f"--data_path {path_prefix!r}")


def tokens_from_prompt(tokenizer_dir: str, prompt: str, vocab_size: int, seq_len: int | None = None) -> torch.Tensor:
    """The prompt's token ids [1, n] (no special tokens added, as in training data) from a local
    Hugging Face tokenizer, cut to ``seq_len`` if longer."""
    from megatron.quant.training.tokenizers import HuggingFaceTokenizer

    if not Path(tokenizer_dir).is_dir():
        raise FileNotFoundError(f"--tokenizer {tokenizer_dir!r} is not a directory (a local Hugging Face tokenizer)")
    ids = HuggingFaceTokenizer(tokenizer_dir).tokenize(prompt)
    if not ids:
        raise ValueError(f"--prompt {prompt!r} encodes to no tokens")
    if seq_len is not None:
        ids = ids[:seq_len]
    return _checked_vocab(torch.tensor([ids], dtype=torch.int64), vocab_size, f"tokenizer {tokenizer_dir!r}")


def _checked_vocab(tokens: torch.Tensor, vocab_size: int, source: str) -> torch.Tensor:
    largest = int(tokens.max())
    if tokens.min() < 0 or largest >= vocab_size:
        raise ValueError(f"{source} gives token id {largest}, outside the model's vocabulary of {vocab_size}")
    return tokens


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"--{name} must be a positive integer, got {value}")
