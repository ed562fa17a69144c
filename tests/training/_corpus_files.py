"""A tiny directory of text files for the corpus builder (tests/training/conftest.py built_corpus)."""

CORPUS_TEXTS = {
    **{f"lib/mod{i}.py": f'"""Module {i}: the quick brown fox jumps over the lazy dog."""\n' + f"x = {i}\n" * 40
       for i in range(8)},
    "docs/copy.rst": "Read the guide to learn how the modules fit together. " * 8,
    "docs/guide.rst": "Read the guide to learn how the modules fit together. " * 8,  # copy.rst's text: dropped
    "docs/notes.txt": "Notes on the design, written in plain English. " * 8,
    "docs/latin1.txt": "caf\xe9".encode("latin-1"),  # not UTF-8: skipped
    "docs/blank.md": "\n\n",  # blank: skipped
    "lib/data.bin": b"\0\1\2",  # another suffix: skipped
    "site-packages/installed.py": "an installed package: skipped\n" * 8,
}
