"""The fixed input: seeded tokens, tokens from an indexed dataset, a prompt through a tokenizer."""
import numpy as np
import pytest
import torch

from megatron.quant.compare import inputs


def test_seeded_tokens_are_reproducible_and_leave_the_global_rng_alone():
    before = torch.get_rng_state()
    first = inputs.seeded_tokens(50, 2, 7, seed=3)
    assert torch.equal(before, torch.get_rng_state())
    assert first.shape == (2, 7) and first.dtype == torch.int64 and int(first.max()) < 50
    assert torch.equal(first, inputs.seeded_tokens(50, 2, 7, seed=3))
    assert not torch.equal(first, inputs.seeded_tokens(50, 2, 7, seed=4))


@pytest.fixture
def dataset_prefix(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = str(tmp_path / "docs")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    for document in ([1, 2, 3], [4, 5, 6, 7, 8], [9, 10, 11, 12]):
        builder.add_document(torch.tensor(document), [len(document)])
    builder.finalize(prefix + ".idx")
    return prefix


def test_dataset_tokens_are_consecutive_windows_of_the_token_stream(dataset_prefix):
    tokens = inputs.tokens_from_dataset(dataset_prefix, vocab_size=20, batch_size=2, seq_len=4, offset=2)
    assert tokens.tolist() == [[3, 4, 5, 6], [7, 8, 9, 10]]


def test_dataset_errors_name_the_problem(dataset_prefix, tmp_path):
    with pytest.raises(ValueError, match="holds 12 tokens; 14 needed"):
        inputs.tokens_from_dataset(dataset_prefix, vocab_size=20, batch_size=2, seq_len=7)
    with pytest.raises(ValueError, match="token id 12, outside the model's vocabulary of 10"):
        inputs.tokens_from_dataset(dataset_prefix, vocab_size=10, batch_size=1, seq_len=12)
    with pytest.raises(FileNotFoundError, match=r"expected .*missing\.bin and .*missing\.idx"):
        inputs.tokens_from_dataset(str(tmp_path / "missing"), vocab_size=20, batch_size=1, seq_len=2)


def test_prompt_is_encoded_by_the_local_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "the": 1, "cat": 2, "sat": 3, "<unk>": 4}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", unk_token="<unk>").save_pretrained(tmp_path)
    assert inputs.tokens_from_prompt(str(tmp_path), "the cat sat", vocab_size=8).tolist() == [[1, 2, 3]]
    assert inputs.tokens_from_prompt(str(tmp_path), "the cat sat", vocab_size=8, seq_len=2).tolist() == [[1, 2]]
    with pytest.raises(ValueError, match="token id 3, outside the model's vocabulary of 3"):
        inputs.tokens_from_prompt(str(tmp_path), "the cat sat", vocab_size=3)
    with pytest.raises(FileNotFoundError, match="--tokenizer"):
        inputs.tokens_from_prompt(str(tmp_path / "nope"), "hi", vocab_size=8)
