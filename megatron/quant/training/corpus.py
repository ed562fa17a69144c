"""A real text corpus from files on this machine: ``python -m megatron.quant.training.corpus OUTPUT_DIR``.

Collects the text files under ``--source`` (default: the Python standard library's sources,
``sysconfig.get_paths()["stdlib"]`` without site-packages: code with English docstrings and
comments, present wherever the project installs), one document per file, in path order; skips
files that are not UTF-8 text and duplicates (same text). Documents are shuffled with ``--seed``
and split by document: the first ones train, the last ``--valid-fraction`` validate. Writes

- ``OUTPUT_DIR/corpus.jsonl``: one ``{"text", "source"}`` object per document, training ones first;
- ``OUTPUT_DIR/corpus_text_document.bin/.idx``: the indexed dataset (``preprocess`` with ``--append-eod``);
- ``OUTPUT_DIR/corpus.json``: the source, counts, and the training flags to use:
  ``--data-path OUTPUT_DIR/corpus_text_document --split N_TRAIN,N_VALID,0`` (megatron-core splits
  by document count, so those are exactly the held-out documents).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import stat
import sys
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

from megatron.quant.analysis.output_dir import OutputDirError, check_output_dir
from megatron.quant.training import preprocess
from megatron.quant.training.arguments import TOKENIZER_TYPES

SUFFIXES = (".py", ".txt", ".rst", ".md")
SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})  # installed packages, bytecode
NAME = "corpus"
MANIFEST = "corpus.json"
MAX_FILE_BYTES = 16 * 2**20  # one document; a larger file is skipped after reading at most this much


class CorpusError(ValueError):
    """A source that gives no corpus; the message names it."""


@dataclass(frozen=True)
class Corpus:
    data_path: str       # --data-path
    split: str           # --split: N_TRAIN,N_VALID,0 documents
    train_documents: int
    valid_documents: int
    bytes: int
    source: list[str]
    seed: int


def default_source() -> Path:
    """The Python standard library's source directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def text_files(root: Path, suffixes: Sequence[str] = SUFFIXES) -> list[Path]:
    """Files under ``root`` with one of ``suffixes``, in path order; hidden and SKIPPED_DIRS left out."""
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS and not d.startswith("."))
        found += [Path(directory) / f for f in files if f.endswith(tuple(suffixes)) and not f.startswith(".")]
    return sorted(found, key=lambda path: path.relative_to(root).as_posix())


def read_text(path: Path) -> str | None:
    """The file's text; None for anything but a regular file (a FIFO or a link to /dev/zero named
    ``*.txt`` is never read), files over MAX_FILE_BYTES, non-UTF-8, binary (NUL bytes), blank or
    unreadable files."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO swapped in since the stat: no wait for a writer
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = handle.read(MAX_FILE_BYTES + 1)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text if len(data) <= MAX_FILE_BYTES and text.strip() and "\0" not in text else None


def collect(roots: Sequence[Path], suffixes: Sequence[str] = SUFFIXES) -> list[tuple[str, str]]:
    """(source, text) per document: every root's text files in path order, the first of equal texts kept."""
    seen: set[bytes] = set()
    documents = []
    for root in roots:
        for path in text_files(root, suffixes):
            text = read_text(path)
            digest = hashlib.sha256(text.encode()).digest() if text is not None else None
            if digest is None or digest in seen:
                continue
            seen.add(digest)
            documents.append((f"{root.name}/{path.relative_to(root).as_posix()}", text))
    return documents


def split_documents(documents: Sequence[tuple[str, str]], valid_fraction: float,
                    seed: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, valid): the documents shuffled with ``seed``; at least one of each."""
    if len(documents) < 2:
        raise CorpusError(f"{len(documents)} document(s): a train/validation split needs at least 2")
    order = list(documents)
    random.Random(seed).shuffle(order)
    valid = min(len(order) - 1, max(1, round(valid_fraction * len(order))))
    return order[:-valid], order[-valid:]


def _write_jsonl(path: Path, documents: Iterable[tuple[str, str]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        for source, text in documents:
            handle.write(json.dumps({"text": text, "source": source}) + "\n")
    os.replace(tmp, path)


def build_corpus(output_dir: Path, roots: Sequence[Path] = (), valid_fraction: float = 0.05, seed: int = 1234,
                 suffixes: Sequence[str] = SUFFIXES, tokenizer: Sequence[str] = ()) -> Corpus:
    """Collect, split and preprocess (see the module docstring); ``tokenizer``: preprocess's tokenizer flags."""
    if not 0 < valid_fraction < 1:
        raise CorpusError(f"--valid-fraction must be between 0 and 1, got {valid_fraction}")
    try:  # refused before the sources are read, not after
        check_output_dir(Path(output_dir), "OUTPUT_DIR")
    except OutputDirError as error:
        raise CorpusError(str(error)) from None
    roots = [Path(root) for root in roots] or [default_source()]
    missing = [str(root) for root in roots if not root.is_dir()]
    if missing:
        raise CorpusError(f"--source {', '.join(missing)}: not a directory")
    documents = collect(roots, suffixes)
    if not documents:
        raise CorpusError(f"no UTF-8 text files ({', '.join(suffixes)}) under {', '.join(map(str, roots))}")
    train, valid = split_documents(documents, valid_fraction, seed)
    output_dir.mkdir(parents=True, exist_ok=True)
    jsonl = output_dir / f"{NAME}.jsonl"
    _write_jsonl(jsonl, train + valid)
    [prefix] = preprocess.main(["--input", str(jsonl), "--output-prefix", str(output_dir / NAME), "--append-eod",
                                "--log-interval", "0", *tokenizer])
    corpus = Corpus(data_path=prefix, split=f"{len(train)},{len(valid)},0", train_documents=len(train),
                    valid_documents=len(valid), bytes=sum(len(text.encode()) for _, text in documents),
                    source=[str(root) for root in roots], seed=seed)
    (output_dir / MANIFEST).write_text(json.dumps(asdict(corpus), indent=1) + "\n")
    return corpus


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m megatron.quant.training.corpus",
                                description="Build a train/validation text corpus (JSONL and indexed dataset) "
                                            "from the text files of a directory.")
    p.add_argument("output_dir", type=Path)
    p.add_argument("--source", type=Path, action="append", default=[],
                   help="directory of text files, repeatable (default: the Python standard library, "
                        f"{default_source()})")
    p.add_argument("--suffixes", nargs="+", default=list(SUFFIXES), help="file name endings (default: %(default)s)")
    p.add_argument("--valid-fraction", type=float, default=0.05, help="validation share of the documents")
    p.add_argument("--seed", type=int, default=1234, help="shuffles the documents before the split")
    p.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, default="ByteTokenizer")
    p.add_argument("--tokenizer-model", default=None, help="local Hugging Face tokenizer directory")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status 0, or 2 with one line naming a bad source or fraction."""
    args = build_parser().parse_args(argv)
    tokenizer = ["--tokenizer-type", args.tokenizer_type]
    if args.tokenizer_model:
        tokenizer += ["--tokenizer-model", args.tokenizer_model]
    try:
        corpus = build_corpus(args.output_dir, args.source, args.valid_fraction, args.seed, args.suffixes, tokenizer)
    except CorpusError as error:
        print(f"corpus: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # e.g. a full disk while writing
        print(f"corpus: error: cannot write {error.filename or args.output_dir}: {error.strerror or error}",
              file=sys.stderr)
        return 2
    print(f"corpus: {corpus.train_documents} training and {corpus.valid_documents} validation documents, "
          f"{corpus.bytes / 1e6:.1f} MB of text from {', '.join(corpus.source)}")
    print(f"train with: --data-path {corpus.data_path} --split {corpus.split}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
