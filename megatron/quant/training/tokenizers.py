"""Tokenizers the datasets and preprocessing use: byte-level (no files), Hugging Face (local), null.

Each exposes what megatron-core's GPTDataset reads (``vocab_size``, ``eod``, ``pad``,
``unique_identifiers``) plus ``tokenize`` / ``detokenize`` and ``tokenize_batch`` (preprocessing:
a Hugging Face tokenizer encodes a batch on all cores).
"""
from __future__ import annotations

from typing import Protocol, Sequence


class Tokenizer(Protocol):
    vocab_size: int
    eod: int
    unique_identifiers: dict

    def tokenize(self, text: str) -> list[int]: ...
    def tokenize_batch(self, texts: Sequence[str]) -> list[list[int]]: ...
    def detokenize(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes are ids 0-255; 256 ends a document, 257 pads. Needs no files."""

    eod = 256
    pad = 257
    vocab_size = 258

    def __init__(self) -> None:
        self.unique_identifiers = {"class": type(self).__name__}

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def tokenize_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.tokenize(text) for text in texts]

    def detokenize(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")


class HuggingFaceTokenizer:
    """A tokenizer from a local directory (``tokenizer.json`` etc.); never touches the network."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        try:
            self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except OSError as err:
            raise ValueError(f"cannot load a Hugging Face tokenizer from {path!r} (a local directory "
                             f"with tokenizer files is needed): {err}") from err
        if self._tok.eos_token_id is None:
            raise ValueError(f"the tokenizer in {path!r} has no EOS token to end documents with")
        self.eod = self._tok.eos_token_id
        if self._tok.pad_token_id is not None and self._tok.pad_token_id != self.eod:
            self.pad = self._tok.pad_token_id
        self.vocab_size = len(self._tok)
        self.unique_identifiers = {"class": type(self).__name__, "path": str(path)}

    def tokenize(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def tokenize_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._tok(list(texts), add_special_tokens=False, verbose=False)["input_ids"]

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))


class NullTokenizer:
    """Megatron-LM's NullTokenizer: text is whitespace-separated ids; the last id ends documents."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.eod = vocab_size - 1
        self.unique_identifiers = {"class": type(self).__name__, "vocab_size": vocab_size}

    def tokenize(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def tokenize_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.tokenize(text) for text in texts]

    def detokenize(self, ids: Sequence[int]) -> str:
        return " ".join(str(int(i)) for i in ids)


def build_tokenizer(tokenizer_type: str, tokenizer_model: str | None = None,
                    vocab_size: int | None = None) -> Tokenizer:
    """The tokenizer named by Megatron-LM's ``--tokenizer-type``."""
    if tokenizer_type == "ByteTokenizer":
        return ByteTokenizer()
    if tokenizer_type == "HuggingFaceTokenizer":
        if tokenizer_model is None:
            raise ValueError("HuggingFaceTokenizer needs a local tokenizer directory (--tokenizer-model)")
        return HuggingFaceTokenizer(tokenizer_model)
    if tokenizer_type == "NullTokenizer":
        if vocab_size is None:
            raise ValueError("NullTokenizer needs --vocab-size")
        return NullTokenizer(vocab_size)
    raise ValueError(f"unknown tokenizer type {tokenizer_type!r}; valid: ByteTokenizer, "
                     "HuggingFaceTokenizer, NullTokenizer")


# Megatron-LM's --make-vocab-size-divisible-by default.
VOCAB_DIVISOR = 128


def padded_vocab_size(tokenizer_vocab: int, divisible_by: int, tensor_parallel: int) -> int:
    """Megatron-LM's vocabulary padding: a multiple of ``divisible_by x TP``."""
    multiple = divisible_by * tensor_parallel
    return -(-tokenizer_vocab // multiple) * multiple
