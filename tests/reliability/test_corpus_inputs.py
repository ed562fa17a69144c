"""The corpus builder reads only regular files, and at most ``MAX_FILE_BYTES`` of each: a FIFO or
a link to /dev/zero named ``*.txt`` is skipped without being read (never a hang, never unbounded
memory), binary, Latin-1, NUL-bearing, oversized and duplicate files are skipped, and an empty
source or an output directory that cannot be written is one line, status 2, before any source is read."""
import os
import signal

import pytest

from megatron.quant.lab import corpus


@pytest.fixture
def hostile_source(tmp_path, monkeypatch):
    source = tmp_path / "source"
    source.mkdir()
    (source / "a.txt").write_text("first document, in English\n")
    (source / "b.md").write_text("second document, in English\n")
    (source / "copy.txt").write_text("first document, in English\n")  # duplicate of a.txt
    (source / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    (source / "nul.txt").write_bytes(b"text with a \0 byte\n")
    (source / "random.py").write_bytes(bytes(range(256)) * 4)
    (source / "large.txt").write_text("x" * 65)
    os.mkfifo(source / "fifo.txt")  # no writer: reading it would wait forever
    os.symlink("/dev/zero", source / "zero.txt")  # reading it would never end
    monkeypatch.setattr(corpus, "MAX_FILE_BYTES", 64)  # large.txt is over the bound
    return source


def _no_hang(seconds: int):
    def stop(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s")
    return signal.signal(signal.SIGALRM, stop), signal.alarm(seconds)


def test_only_regular_text_files_are_read(hostile_source):
    previous, _ = _no_hang(20)
    try:
        documents = corpus.collect([hostile_source])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert sorted(source for source, _ in documents) == ["source/a.txt", "source/b.md"]


def test_empty_source_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert corpus.main([str(tmp_path / "out"), "--source", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "no UTF-8 text files (.py, .txt, .rst, .md) under" in err, err


def test_unwritable_output_is_one_line_before_reading(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(corpus, "collect", lambda *a: pytest.fail("sources read before the output was checked"))
    assert corpus.main([str(tmp_path / "file" / "out"), "--source", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "OUTPUT_DIR" in err and "is an existing file, not a directory" in err, err
