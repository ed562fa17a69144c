"""A corpus anyone can rebuild: the text files of one pinned distribution, named after it and not after
the node, the same corpus (hash) wherever it is installed; other versions and loose specs refused."""
import json
import sys

import pytest

from megatron.quant.lab.corpus import CorpusError
from megatron.quant.lab.package_corpus import build_package_corpus, package_files

TEXTS = {"textpkg/README.txt": "A package that ships text.\n" * 20, "textpkg/docs/guide.rst": "Guide\n=====\n" * 30,
         "textpkg/docs/notes.md": "# Notes\nThe quick brown fox.\n" * 25, "textpkg/code.py": "x = 1\n"}


def _install(site, version="1.0"):
    """A distribution as pip installs one: its files and a dist-info listing them (RECORD)."""
    for path, text in TEXTS.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    info = site / f"textpkg-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: textpkg\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{path},,\n" for path in TEXTS) + f"{info.name}/METADATA,,\n")


@pytest.mark.parametrize("spec, message", [
    ("textpkg", "expected NAME==VERSION"), ("textpkg>=1.0", "expected NAME==VERSION"),
    ("textpkg==2.0", "version 1.0 is installed; pip install textpkg==2.0"), ("nopkg==1.0", "nopkg: not installed"),
])
def test_only_an_installed_pinned_version_is_taken(tmp_path, monkeypatch, spec, message):
    _install(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(CorpusError, match=message):
        package_files(spec, (".txt",))


@pytest.mark.slow  # preprocesses two small corpora (about 13 s, most of it the tokenizer's imports)
def test_the_same_distribution_gives_the_same_corpus_wherever_it_is_installed(tmp_path, monkeypatch):
    hashes, base = [], list(sys.path)
    for place in ("one", "two"):
        site = tmp_path / place
        site.mkdir()
        _install(site)
        monkeypatch.setattr(sys, "path", [str(site), *base])
        name, version, files = package_files("textpkg==1.0", (".txt", ".rst", ".md"))
        assert (name, version, len(files)) == ("textpkg", "1.0", 3)  # the .py file is not text here
        built = build_package_corpus(tmp_path / f"corpus-{place}", "textpkg==1.0", valid_fraction=0.4)
        assert built.source == ["pypi:textpkg==1.0"] and built.train_documents + built.valid_documents == 3
        record = json.loads((tmp_path / f"corpus-{place}" / "package.json").read_text())
        assert record["version"] == "1.0" and sorted(f["path"] for f in record["files"]) == [
            "README.txt", "docs/guide.rst", "docs/notes.md"]
        hashes.append(built.sha256)
    assert hashes[0] == hashes[1]
