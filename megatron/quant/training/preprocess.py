"""JSONL -> megatron-core indexed dataset (``.bin/.idx``), as Megatron-LM's tools/preprocess_data.py.

Each line is a JSON object; the ``--json-keys`` fields are tokenized and written as one
document each, EOD appended with ``--append-eod``. Output: ``{prefix}_{key}_document.bin/.idx``
(the prefix to pass to ``--data-path`` is ``{prefix}_{key}_document``). Files are written
under temporary names and renamed when complete.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from typing import Iterable, Sequence

import numpy as np

from megatron.quant.training.arguments import TOKENIZER_TYPES
from megatron.quant.training.tokenizers import Tokenizer, build_tokenizer


def output_prefix(prefix: str, key: str) -> str:
    return f"{prefix}_{key}_document"


def write_indexed_dataset(documents: Iterable[list[int]], prefix: str, vocab_size: int,
                          progress_every: int = 0) -> int:
    """Write token-id documents to ``prefix.bin/.idx``; returns the number of documents."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    tmp = f"{prefix}.tmp{os.getpid()}"
    builder = IndexedDatasetBuilder(tmp + ".bin", dtype=DType.optimal_dtype(vocab_size))
    count, start = 0, time.perf_counter()
    for ids in documents:
        if not ids:
            continue
        builder.add_document(np.asarray(ids), [len(ids)])
        count += 1
        if progress_every and count % progress_every == 0:
            print(f"  {count} documents ({count / (time.perf_counter() - start):.0f}/s)", flush=True)
    builder.finalize(tmp + ".idx")
    os.replace(tmp + ".bin", prefix + ".bin")
    os.replace(tmp + ".idx", prefix + ".idx")
    return count


def _records(lines: Iterable[str], key: str, source: str) -> Iterable[str]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{source}:{number}: not a JSON object: {err}") from None
        if key not in record:
            raise ValueError(f"{source}:{number}: no {key!r} field (fields: {sorted(record)}); set --json-keys")
        yield record[key]


BATCH = 256  # documents tokenized at once (a Hugging Face tokenizer spreads a batch over the cores)


def tokenized_documents(lines: Iterable[str], key: str, tokenizer: Tokenizer, append_eod: bool,
                        source: str) -> Iterable[list[int]]:
    texts = iter(_records(lines, key, source))
    while batch := list(itertools.islice(texts, BATCH)):
        for ids in tokenizer.tokenize_batch(batch):
            yield ids + [tokenizer.eod] if append_eod else ids


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--input", required=True, help="JSONL file, one document per line")
    p.add_argument("--output-prefix", required=True)
    p.add_argument("--json-keys", nargs="+", default=["text"])
    p.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, default="ByteTokenizer")
    p.add_argument("--tokenizer-model", default=None, help="local Hugging Face tokenizer directory")
    p.add_argument("--vocab-size", type=int, default=None, help="for NullTokenizer")
    p.add_argument("--append-eod", action="store_true")
    p.add_argument("--log-interval", type=int, default=10000)
    return p


def main(argv: Sequence[str] | None = None) -> list[str]:
    """Preprocess; returns the dataset prefixes written (one per JSON key)."""
    args = build_parser().parse_args(argv)
    if not os.path.isfile(args.input):
        sys.exit(f"preprocess_data: error: --input {args.input!r} does not exist")
    tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model, args.vocab_size)
    os.makedirs(os.path.dirname(os.path.abspath(args.output_prefix)), exist_ok=True)
    prefixes = []
    for key in args.json_keys:
        prefix = output_prefix(args.output_prefix, key)
        with open(args.input, encoding="utf-8") as f:
            docs = tokenized_documents(f, key, tokenizer, args.append_eod, args.input)
            count = write_indexed_dataset(docs, prefix, tokenizer.vocab_size, args.log_interval)
        print(f"wrote {count} documents to {prefix}.bin/.idx (use --data-path {prefix})", flush=True)
        prefixes.append(prefix)
    return prefixes


if __name__ == "__main__":
    main()
