"""Preprocessing round trip, tokenizers, blends, and the sampler layout."""
import json

import numpy as np
import pytest

from megatron.quant.training import preprocess
from megatron.quant.training.data import BatchLayout, build_datasets, parse_blend
from megatron.quant.training.tokenizers import ByteTokenizer, HuggingFaceTokenizer

TEXTS = ["Hello, world.", "Ünïcödé — 汉字 and emoji 🙂", "x" * 300, "last one\nwith a newline"]


def _write_jsonl(path, texts, key="text"):
    path.write_text("".join(json.dumps({key: t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


def _documents(prefix):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(prefix)
    return [dataset[i].tolist() for i in range(len(dataset))]


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    for text in TEXTS:
        assert tok.detokenize(tok.tokenize(text)) == text
    assert tok.eod >= 256 and tok.vocab_size > tok.eod


def test_preprocess_round_trip_through_megatron_reader(tmp_path):
    src = _write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    [prefix] = preprocess.main(["--input", str(src), "--output-prefix", str(tmp_path / "out" / "corpus"),
                                "--append-eod"])
    assert prefix == str(tmp_path / "out" / "corpus_text_document")
    expected = [list(t.encode("utf-8")) + [ByteTokenizer.eod] for t in TEXTS]
    assert _documents(prefix) == expected
    assert not list((tmp_path / "out").glob("*.tmp*"))


def test_gpt_dataset_samples_are_windows_of_the_document_stream(tmp_path):
    src = _write_jsonl(tmp_path / "docs.jsonl", TEXTS * 5)
    [prefix] = preprocess.main(["--input", str(src), "--output-prefix", str(tmp_path / "c"), "--append-eod"])
    docs = _documents(prefix)
    train, _, _ = build_datasets(ByteTokenizer(), seq_length=32, seed=1, data_path=[prefix], split="100,0,0",
                                 num_samples=[20, 0, 0], cache_path=str(tmp_path / "cache"))
    def joined(ids) -> str:
        return "," + ",".join(str(int(i)) for i in ids) + ","

    stream = joined(np.concatenate([docs[i] for i in train.document_index]))
    for i in range(len(train)):
        sample = train[i]
        window = joined(sample["tokens"].tolist() + sample["labels"][-1:].tolist())
        assert window in stream, i  # 33 consecutive ids of the stream, in order
        assert sample["tokens"][1:].tolist() == sample["labels"][:-1].tolist()


def test_huggingface_tokenizer_from_a_local_directory(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel()
    raw.train_from_iterator(TEXTS * 3, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"]))
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>", unk_token="<unk>").save_pretrained(tmp_path / "tok")
    tok = HuggingFaceTokenizer(str(tmp_path / "tok"))
    assert tok.eod == raw.token_to_id("</s>")
    src = _write_jsonl(tmp_path / "docs.jsonl", TEXTS)
    [prefix] = preprocess.main(["--input", str(src), "--output-prefix", str(tmp_path / "hf"), "--append-eod",
                                "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tmp_path / "tok")])
    assert _documents(prefix) == [raw.encode(t).ids + [tok.eod] for t in TEXTS]


def test_preprocess_names_a_missing_field(tmp_path):
    src = _write_jsonl(tmp_path / "docs.jsonl", TEXTS, key="body")
    with pytest.raises(ValueError, match="no 'text' field"):
        preprocess.main(["--input", str(src), "--output-prefix", str(tmp_path / "o")])


def test_blend_parsing_and_missing_files(tmp_path):
    assert parse_blend(["0.3", "a", "0.7", "b"]) == (["a", "b"], [0.3, 0.7])
    assert parse_blend(["a"]) == (["a"], None)
    with pytest.raises(ValueError, match="'a' is not a weight"):
        parse_blend(["a", "b"])
    with pytest.raises(ValueError, match=r"nope\.idx: No such file or directory"):
        build_datasets(ByteTokenizer(), seq_length=8, seed=0, data_path=[str(tmp_path / "nope")], split="1,0,0",
                       num_samples=[1, 0, 0])


@pytest.mark.parametrize("mbs, gbs, dp", [(1, 1, 1), (2, 8, 2), (3, 12, 2), (1, 6, 3)])
def test_each_iteration_reads_its_global_batch_exactly_once(mbs, gbs, dp):
    layout = BatchLayout(mbs, gbs, dp)
    for iteration in range(3):
        samples = [layout.first_sample(iteration, mb, rank) + j
                   for mb in range(gbs // (mbs * dp)) for rank in range(dp) for j in range(mbs)]
        assert sorted(samples) == list(range(iteration * gbs, (iteration + 1) * gbs))
