"""The corpus builder: a tiny directory of text files -> JSONL -> indexed dataset -> a training step."""
import json

import numpy as np
import pytest

from megatron.quant.lab import corpus as corpus_module
from megatron.quant.training.tokenizers import ByteTokenizer
from tests.training._corpus_files import CORPUS_TEXTS

KEPT = sorted(["lib/mod0.py", "lib/mod1.py", "lib/mod2.py", "lib/mod3.py", "lib/mod4.py", "lib/mod5.py", "lib/mod6.py",
               "lib/mod7.py", "docs/copy.rst", "docs/notes.txt"])


def _jsonl(out):
    return [json.loads(line) for line in (out / "corpus.jsonl").read_text().splitlines()]


def test_text_files_are_collected_deduplicated_and_split_by_document(built_corpus):
    source, out, built = built_corpus
    records = _jsonl(out)
    assert sorted(r["source"].split("/", 1)[1] for r in records) == KEPT  # no guide (copy's text), latin-1, blank, .bin
    assert all(r["text"] == CORPUS_TEXTS[r["source"].split("/", 1)[1]] for r in records)
    assert (built.train_documents, built.valid_documents, built.split) == (8, 2, "8,2,0")
    assert json.loads((out / "corpus.json").read_text())["split"] == "8,2,0"
    again = corpus_module.split_documents(corpus_module.collect([source]), 0.2, seed=3)
    assert [s for s, _ in again[0] + again[1]] == [r["source"] for r in records]  # deterministic
    other = corpus_module.split_documents(corpus_module.collect([source]), 0.2, seed=4)
    assert [s for s, _ in other[1]] != [s for s, _ in again[1]]  # the seed picks the held-out documents


def test_indexed_dataset_holds_the_documents_in_jsonl_order(built_corpus):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    _, out, built = built_corpus
    dataset = IndexedDataset(built.data_path)
    expected = [list(r["text"].encode()) + [ByteTokenizer.eod] for r in _jsonl(out)]
    assert [np.asarray(dataset[i]).tolist() for i in range(len(dataset))] == expected


@pytest.mark.slow
def test_a_training_step_reads_the_corpus_and_validates_on_the_held_out_split(one_rank):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    [step] = one_rank["built_corpus"]
    assert step["iteration"] == 1 and 4.0 < step["lm loss"] < 7.0  # about ln(258) at initialisation
    events = EventAccumulator(one_rank["corpus_tensorboard_dir"]).Reload()
    [(iteration, loss)] = [(e.step, e.value) for e in events.Scalars("validation/lm loss")]
    assert iteration == 1 and np.isfinite(loss)


@pytest.mark.parametrize("argv, message", [
    (["--source", "/nonexistent/dir"], "--source /nonexistent/dir: not a directory"),
    (["--valid-fraction", "1.5"], "--valid-fraction must be between 0 and 1, got 1.5"),
    (["--suffixes", ".nothing"], "no UTF-8 text files (.nothing) under"),
])
def test_bad_sources_are_one_line_and_status_2(tmp_path, capsys, built_corpus, argv, message):
    source = built_corpus[0]
    argv = argv if argv[0] == "--source" else ["--source", str(source), *argv]
    assert corpus_module.main([str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_main_prints_the_training_flags(tmp_path, capsys, built_corpus):
    assert corpus_module.main([str(tmp_path / "c"), "--source", str(built_corpus[0]), "--valid-fraction", "0.3"]) == 0
    assert f"--data-path {tmp_path / 'c' / 'corpus_text_document'} --split 7,3,0" in capsys.readouterr().out
