"""A corpus anyone can rebuild offline: the text files of one PyPI distribution at a pinned version.

``python -m megatron.quant.lab.package_corpus OUTPUT_DIR --package NAME==VERSION [--suffixes .txt .rst]
[--tokenizer-vocab N] ...``: the files the installed distribution ``NAME`` lists in its RECORD (so
exactly what ``pip install NAME==VERSION`` puts on any machine, nothing else of the node), those with
one of ``--suffixes``, become the documents of ``corpus.build_corpus`` (the same split, tokenizer and
hash). The installed version must be the one asked for: another version is other text. Beside the
corpus, ``package.json`` records the distribution, its version, and each file's path and sha256, so a
rebuild elsewhere can be checked file by file; the manifest's ``source`` is ``pypi:NAME==VERSION``.

The corpus the first GPU tier trained on (the node's whole Python installation) cannot be rebuilt
elsewhere: it depends on what that node had installed. A corpus from a pinned distribution can.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path
from typing import Sequence

from megatron.quant.lab.corpus import MANIFEST, Corpus, CorpusError, build_corpus

PACKAGE_RECORD = "package.json"
TEXT_SUFFIXES = (".txt", ".rst", ".md")


def package_files(spec: str, suffixes: Sequence[str]) -> tuple[str, str, list[Path]]:
    """(name, version, the installed files of the distribution with one of ``suffixes``, in path order)
    for ``spec`` (``NAME==VERSION``); CorpusError (one line) for another form, a distribution that is not
    installed, another installed version, or one without such files."""
    name, sep, version = spec.partition("==")
    if not sep or not name.strip() or not version.strip() or any(c in spec for c in " <>!~;,"):
        raise CorpusError(f"--package {spec[:80]!r}: expected NAME==VERSION (a pinned version: other versions are "
                          "other text)")
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise CorpusError(f"--package {name}: not installed; pip install {name}=={version}") from None
    if dist.version != version:
        raise CorpusError(f"--package {spec}: version {dist.version} is installed; pip install {name}=={version}")
    files = sorted((Path(dist.locate_file(f)) for f in dist.files or []
                    if f.suffix in tuple(suffixes) and ".dist-info" not in f.parts[0]), key=str)
    files = [path for path in files if path.is_file()]
    if not files:
        raise CorpusError(f"--package {spec}: none of its files ends with {', '.join(suffixes)}")
    return dist.metadata["Name"], version, files


def build_package_corpus(output_dir: Path, spec: str, suffixes: Sequence[str] = TEXT_SUFFIXES,
                         **options) -> Corpus:
    """The corpus of ``spec``'s text files (``package_files``) in ``output_dir``; ``options`` as
    ``corpus.build_corpus`` takes them."""
    name, version, files = package_files(spec, suffixes)
    root_name = f"{name}-{version}"
    with tempfile.TemporaryDirectory() as staging:  # the documents named after the distribution, not the node
        root = Path(staging) / root_name
        common = Path(os.path.commonpath([str(path.parent) for path in files]))
        for path in files:
            target = root / path.relative_to(common)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        built = build_corpus(output_dir, [root], suffixes=suffixes, **options)
    built = replace(built, source=[f"pypi:{name}=={version}"])
    (output_dir / MANIFEST).write_text(json.dumps(asdict(built), indent=1) + "\n")
    record = {"package": name, "version": version, "files": [
        {"path": path.relative_to(common).as_posix(), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        for path in files]}
    (output_dir / PACKAGE_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return built


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 built, 2 bad input (one line)."""
    p = argparse.ArgumentParser(prog="python -m megatron.quant.lab.package_corpus",
                                description="Build a corpus from the text files of one pinned PyPI distribution.")
    p.add_argument("output_dir", type=Path)
    p.add_argument("--package", required=True, help="NAME==VERSION of an installed distribution")
    p.add_argument("--suffixes", nargs="+", default=list(TEXT_SUFFIXES), help="file endings taken as text")
    p.add_argument("--valid-fraction", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--max-bytes", type=int, default=None)
    p.add_argument("--tokenizer-vocab", type=int, default=None, help="train a byte-level BPE of this many tokens")
    args = p.parse_args(argv)
    try:
        built = build_package_corpus(args.output_dir, args.package, tuple(args.suffixes),
                                     valid_fraction=args.valid_fraction, seed=args.seed, max_bytes=args.max_bytes,
                                     tokenizer_vocab=args.tokenizer_vocab)
    except CorpusError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"corpus of {built.source[0]}: {built.train_documents + built.valid_documents} documents, "
          f"{built.bytes:,} bytes, {built.tokens:,} tokens, sha256 {built.sha256[:16]}; flags: --data-path "
          f"{built.data_path} --split {built.split} {' '.join(built.tokenizer)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
