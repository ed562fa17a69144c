"""A real text corpus from local files: ``python -m megatron.quant.lab.corpus OUTPUT_DIR``.

Collects the text files under ``--source`` (default: the Python standard library's sources,
``sysconfig.get_paths()["stdlib"]`` without site-packages: code with English docstrings and
comments, present wherever the project installs; ``--site-packages`` adds the installed packages'
text, ``installation_sources()``), one document per file, in path order; skips files that are not
UTF-8 text and duplicates (same text). Documents are shuffled with ``--seed``, cut to the first
``--max-bytes`` of text, and split by document: the first ones train, the last ``--valid-fraction``
validate. The same files give the same corpus, byte for byte. ``--tokenizer-vocab N`` trains a
byte-level BPE tokenizer of N tokens on the training documents (``bpe``; the first
``--tokenizer-train-bytes`` of them), saves it beside the corpus (``tokenizer.json``) and
tokenizes with it; otherwise ``--tokenizer-type`` (default bytes). Writes

- ``OUTPUT_DIR/corpus.jsonl``: one ``{"text", "source"}`` object per document, training ones first;
- ``OUTPUT_DIR/tokenizer.json`` (and ``tokenizer_config.json``), with ``--tokenizer-vocab``;
- ``OUTPUT_DIR/corpus_text_document.bin/.idx``: the indexed dataset (``preprocess`` with ``--append-eod``);
- ``OUTPUT_DIR/corpus.json``: the source, counts (documents, bytes, tokens), the content hash
  (``corpus_hash``: runs on corpora of different hashes are different experiments) and the
  training flags to use: ``--data-path OUTPUT_DIR/corpus_text_document --split N_TRAIN,N_VALID,0``
  (megatron-core splits by document count, so those are exactly the held-out documents) and the
  tokenizer's flags.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shlex
import stat
import sys
import sysconfig
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from megatron.quant.output_dir import OutputDirError, check_output_dir
from megatron.quant.training import bpe, preprocess
from megatron.quant.training.arguments import TOKENIZER_TYPES

SUFFIXES = (".py", ".txt", ".rst", ".md")
SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})  # installed packages, bytecode
NAME = "corpus"
MANIFEST = "corpus.json"
MAX_FILE_BYTES = 16 * 2**20  # one document; a larger file is skipped after reading at most this much
HASH_CHUNK = 1 << 22


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
    tokens: int = 0                 # training and validation tokens, end-of-document tokens included
    train_tokens: int = 0
    sha256: str = ""                # corpus_hash
    tokenizer: list[str] = field(default_factory=list)  # the training flags that choose its tokenizer
    max_bytes: int | None = None


def default_source() -> Path:
    """The Python standard library's source directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def installation_sources() -> list[Path]:
    """This Python installation's text: the standard library and the site-packages directories."""
    paths = sysconfig.get_paths()
    roots = [Path(paths[key]).resolve() for key in ("stdlib", "purelib", "platlib")]  # lib64 -> lib: one root
    return [root for i, root in enumerate(roots) if root.is_dir() and root not in roots[:i]]


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


def split_documents(documents: Sequence[tuple[str, str]], valid_fraction: float, seed: int,
                    max_bytes: int | None = None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, valid): the documents shuffled with ``seed``, the first ``max_bytes`` of text kept;
    at least one of each."""
    order = list(documents)
    random.Random(seed).shuffle(order)
    kept = [text for text in bpe.bytes_capped((text for _, text in order), max_bytes)]
    order = order[:len(kept)]
    if len(order) < 2:
        raise CorpusError(f"{len(order)} document(s): a train/validation split needs at least 2")
    valid = min(len(order) - 1, max(1, round(valid_fraction * len(order))))
    return order[:-valid], order[-valid:]


def _write_jsonl(path: Path, documents: Iterable[tuple[str, str]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        for source, text in documents:
            handle.write(json.dumps({"text": text, "source": source}) + "\n")
    os.replace(tmp, path)


def corpus_hash(output_dir: Path, split: str) -> str:
    """sha256 of the corpus: its text (JSONL), tokenizer (when trained), indexed dataset and split,
    in that order; equal hashes, equal training data."""
    digest = hashlib.sha256()
    for name in (f"{NAME}.jsonl", bpe.TOKENIZER_FILE, f"{NAME}_text_document.bin", f"{NAME}_text_document.idx"):
        path = output_dir / name
        if not path.is_file():
            continue
        digest.update(name.encode() + b"\0")
        with open(path, "rb") as handle:
            while chunk := handle.read(HASH_CHUNK):
                digest.update(chunk)
    digest.update(f"split {split}".encode())
    return digest.hexdigest()


def _token_counts(prefix: str, train_documents: int) -> tuple[int, int]:
    """(all tokens, training tokens) of the indexed dataset at ``prefix``."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(prefix)  # held: its lengths are a view of its memory map
    lengths = np.array(dataset.sequence_lengths, dtype=np.int64)
    return int(lengths.sum()), int(lengths[:train_documents].sum())


def build_corpus(output_dir: Path, roots: Sequence[Path] = (), valid_fraction: float = 0.05, seed: int = 1234,
                 suffixes: Sequence[str] = SUFFIXES, tokenizer: Sequence[str] = (), max_bytes: int | None = None,
                 tokenizer_vocab: int | None = None, tokenizer_train_bytes: int | None = None) -> Corpus:
    """Collect, split, train a tokenizer when ``tokenizer_vocab`` is given, preprocess (see the
    module docstring); ``tokenizer``: preprocess's tokenizer flags otherwise."""
    if not 0 < valid_fraction < 1:
        raise CorpusError(f"--valid-fraction must be between 0 and 1, got {valid_fraction}")
    try:  # refused before the sources are read, not after
        check_output_dir(Path(output_dir), "OUTPUT_DIR")
    except OutputDirError as error:
        raise CorpusError(str(error)) from None
    if max_bytes is not None and max_bytes <= 0:
        raise CorpusError(f"--max-bytes must be positive, got {max_bytes}")
    roots = [Path(root) for root in roots] or [default_source()]
    missing = [str(root) for root in roots if not root.is_dir()]
    if missing:
        raise CorpusError(f"--source {', '.join(missing)}: not a directory")
    documents = collect(roots, suffixes)
    if not documents:
        raise CorpusError(f"no UTF-8 text files ({', '.join(suffixes)}) under {', '.join(map(str, roots))}")
    train, valid = split_documents(documents, valid_fraction, seed, max_bytes)
    output_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_vocab is not None:
        try:
            bpe.train_bpe(bpe.bytes_capped((text for _, text in train), tokenizer_train_bytes), tokenizer_vocab,
                          output_dir)
        except bpe.TokenizerTrainingError as error:
            raise CorpusError(str(error)) from error
        tokenizer = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(output_dir)]
    jsonl = output_dir / f"{NAME}.jsonl"
    _write_jsonl(jsonl, train + valid)
    [prefix] = preprocess.main(["--input", str(jsonl), "--output-prefix", str(output_dir / NAME), "--append-eod",
                                "--log-interval", "0", *tokenizer])
    split = f"{len(train)},{len(valid)},0"
    tokens, train_tokens = _token_counts(prefix, len(train))
    corpus = Corpus(data_path=prefix, split=split, train_documents=len(train), valid_documents=len(valid),
                    bytes=sum(len(text.encode()) for _, text in train + valid), source=[str(root) for root in roots],
                    seed=seed, tokens=tokens, train_tokens=train_tokens, sha256=corpus_hash(output_dir, split),
                    tokenizer=list(tokenizer), max_bytes=max_bytes)
    # whole or absent: a second study into the same directory reads it as soon as it exists
    tmp = output_dir / f".{MANIFEST}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(asdict(corpus), indent=1) + "\n")
    os.replace(tmp, output_dir / MANIFEST)
    return corpus


def read_manifest(output_dir: Path) -> Corpus | None:
    """The corpus built in ``output_dir``; None when none was."""
    path = output_dir / MANIFEST
    if not path.is_file():
        return None
    try:
        return Corpus(**json.loads(path.read_text()))
    except (ValueError, TypeError) as error:
        raise CorpusError(f"{path} is not a corpus manifest ({error}); remove {output_dir} to rebuild it") from error


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m megatron.quant.lab.corpus",
                                description="Build a train/validation text corpus (JSONL and indexed dataset) "
                                            "from the text files of a directory.")
    p.add_argument("output_dir", type=Path)
    p.add_argument("--source", type=Path, action="append", default=[],
                   help="directory of text files, repeatable (default: the Python standard library, "
                        f"{default_source()})")
    p.add_argument("--site-packages", action="store_true",
                   help="the Python installation's text: the standard library and site-packages "
                        f"({', '.join(map(str, installation_sources()))}); with --source, added to it")
    p.add_argument("--max-bytes", type=int, default=None, help="keep the first N bytes of the shuffled documents")
    p.add_argument("--suffixes", nargs="+", default=list(SUFFIXES), help="file name endings (default: %(default)s)")
    p.add_argument("--valid-fraction", type=float, default=0.05, help="validation share of the documents")
    p.add_argument("--seed", type=int, default=1234, help="shuffles the documents before the split")
    p.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, default="ByteTokenizer")
    p.add_argument("--tokenizer-model", default=None, help="local Hugging Face tokenizer directory")
    p.add_argument("--tokenizer-vocab", type=int, default=None, metavar="N",
                   help="train a byte-level BPE tokenizer of N tokens on the training documents, save it beside "
                        "the corpus and tokenize with it (instead of --tokenizer-type)")
    p.add_argument("--tokenizer-train-bytes", type=int, default=None, metavar="N",
                   help="train the tokenizer on the first N bytes of the training documents (default: all)")
    p.add_argument("--print-data", action="store_true",
                   help="build nothing: print the corpus built in OUTPUT_DIR as 'DATA_PATH SPLIT' (for scripts)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status 0, or 2 with one line naming a bad source or fraction."""
    args = build_parser().parse_args(argv)
    if args.print_data:
        return _print_data(args.output_dir)
    if args.tokenizer_type == "HuggingFaceTokenizer" and not args.tokenizer_model:
        print("corpus: error: --tokenizer-type HuggingFaceTokenizer needs --tokenizer-model DIR (a local Hugging Face "
              "tokenizer directory)", file=sys.stderr)
        return 2
    tokenizer = ["--tokenizer-type", args.tokenizer_type]
    if args.tokenizer_model:
        tokenizer += ["--tokenizer-model", args.tokenizer_model]
    roots = [*args.source, *(installation_sources() if args.site_packages else [])]
    if args.tokenizer_vocab is not None and (args.tokenizer_model or args.tokenizer_type != "ByteTokenizer"):
        print("corpus: error: --tokenizer-vocab trains the corpus's own tokenizer; drop --tokenizer-type and "
              "--tokenizer-model", file=sys.stderr)
        return 2
    try:
        corpus = build_corpus(args.output_dir, roots, args.valid_fraction, args.seed, args.suffixes, tokenizer,
                              args.max_bytes, args.tokenizer_vocab, args.tokenizer_train_bytes)
    except (CorpusError, ValueError) as error:  # ValueError: a tokenizer directory transformers cannot read
        print(f"corpus: error: {str(error).splitlines()[0] if str(error) else type(error).__name__}", file=sys.stderr)
        return 2
    except OSError as error:  # e.g. a full disk while writing
        print(f"corpus: error: cannot write {error.filename or args.output_dir}: {error.strerror or error}",
              file=sys.stderr)
        return 2
    print(f"corpus: {corpus.train_documents} training and {corpus.valid_documents} validation documents, "
          f"{corpus.bytes / 1e6:.1f} MB of text, {corpus.tokens:,} tokens ({corpus.train_tokens:,} training) "
          f"from {', '.join(corpus.source)}; sha256 {corpus.sha256}")
    print(f"train with: --data-path {corpus.data_path} --split {corpus.split} {shlex.join(corpus.tokenizer)}".rstrip())
    return 0


def _print_data(output_dir: Path) -> int:
    try:
        built = read_manifest(output_dir)
    except CorpusError as error:
        print(f"corpus: error: {error}", file=sys.stderr)
        return 2
    if built is None:
        print(f"corpus: error: no corpus built in {output_dir} (no {MANIFEST})", file=sys.stderr)
        return 2
    print(built.data_path, built.split)
    return 0


if __name__ == "__main__":
    sys.exit(main())
