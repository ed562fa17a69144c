"""The corpus's own BPE tokenizer: trained offline on a tiny directory, deterministic, loaded
through the Hugging Face tokenizer path, recorded in the corpus manifest with the content hash."""
import json

import numpy as np
import pytest

from megatron.quant.lab import corpus as corpus_module
from megatron.quant.training import bpe
from megatron.quant.training.tokenizers import build_tokenizer

TEXTS = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog.\n",
         "for i in range(10):\n    print(i)  # café\n"] * 5
VOCAB = 300


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bpe")
    bpe.train_bpe(iter(TEXTS), VOCAB, out)
    return out


def test_a_trained_tokenizer_loads_through_the_hugging_face_path_and_round_trips(tokenizer_dir):
    tok = build_tokenizer("HuggingFaceTokenizer", str(tokenizer_dir))
    assert tok.vocab_size == VOCAB and tok.detokenize([tok.eod]) == bpe.EOS
    text = "def lazy(fox):\n    return 'naïve' + fox  # unseen bytes too: ✓\n"
    ids = tok.tokenize(text)
    assert tok.detokenize(ids) == text  # byte-level: every text encodes exactly
    assert len(ids) < len(text.encode())  # and merges shorten it
    assert tok.tokenize_batch([text, TEXTS[0]]) == [ids, tok.tokenize(TEXTS[0])]


def test_training_is_deterministic(tokenizer_dir, tmp_path):
    bpe.train_bpe(iter(TEXTS), VOCAB, tmp_path)
    assert (tmp_path / bpe.TOKENIZER_FILE).read_bytes() == (tokenizer_dir / bpe.TOKENIZER_FILE).read_bytes()


def test_too_small_a_vocabulary_is_refused(tmp_path):
    with pytest.raises(bpe.TokenizerTrainingError, match="--tokenizer-vocab 200: .* at least 257"):
        bpe.train_bpe(iter(TEXTS), 200, tmp_path)


def test_bytes_capped_keeps_whole_texts_up_to_the_crossing_one():
    assert list(bpe.bytes_capped(["ab", "cd", "ef"], 3)) == ["ab", "cd"]
    assert list(bpe.bytes_capped(["ab", "cd"], None)) == ["ab", "cd"]


@pytest.fixture(scope="module")
def bpe_corpus(built_corpus, tmp_path_factory):
    source = built_corpus[0]
    out = tmp_path_factory.mktemp("bpe_corpus")
    return source, out, corpus_module.build_corpus(out, [source], valid_fraction=0.2, seed=3, tokenizer_vocab=VOCAB)


def test_the_corpus_trains_its_tokenizer_and_records_tokens_and_hash(bpe_corpus):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    source, out, built = bpe_corpus
    assert built.tokenizer == ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(out)]
    tok = build_tokenizer("HuggingFaceTokenizer", str(out))
    dataset = IndexedDataset(built.data_path)
    records = [json.loads(line) for line in (out / "corpus.jsonl").read_text().splitlines()]
    assert [np.asarray(dataset[i]).tolist() for i in range(len(dataset))] == [
        tok.tokenize(r["text"]) + [tok.eod] for r in records]
    assert built.tokens == sum(len(dataset[i]) for i in range(len(dataset)))
    assert built.train_tokens == sum(len(dataset[i]) for i in range(built.train_documents))
    assert corpus_module.read_manifest(out) == built
    assert built.sha256 == corpus_module.corpus_hash(out, built.split)


def test_the_same_files_give_the_same_hash_and_another_seed_another(bpe_corpus, tmp_path):
    source, out, built = bpe_corpus
    again = corpus_module.build_corpus(tmp_path / "again", [source], valid_fraction=0.2, seed=3, tokenizer_vocab=VOCAB)
    assert again.sha256 == built.sha256
    other = corpus_module.build_corpus(tmp_path / "other", [source], valid_fraction=0.2, seed=4, tokenizer_vocab=VOCAB)
    assert other.sha256 != built.sha256


def test_max_bytes_keeps_the_first_shuffled_documents(built_corpus):
    documents = corpus_module.collect([built_corpus[0]])
    full_train, full_valid = corpus_module.split_documents(documents, 0.2, seed=3)
    first_three = sum(len(text.encode()) for _, text in full_train[:3])
    train, valid = corpus_module.split_documents(documents, 0.2, seed=3, max_bytes=first_three - 1)
    assert train + valid == full_train[:3]
    with pytest.raises(corpus_module.CorpusError, match="1 document"):
        corpus_module.split_documents(documents, 0.2, seed=3, max_bytes=1)


def test_tokenizer_vocab_with_another_tokenizer_is_one_line(tmp_path, capsys, built_corpus):
    argv = [str(tmp_path / "c"), "--source", str(built_corpus[0]), "--tokenizer-vocab", "300",
            "--tokenizer-type", "NullTokenizer"]
    assert corpus_module.main(argv) == 2
    assert "drop --tokenizer-type" in capsys.readouterr().err
