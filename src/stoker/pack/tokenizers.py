"""Tokenizers for :func:`~stoker.pack.tokens.pack_tokens`: a function of one text, or a Hugging
Face ``tokenizers`` JSON file, made into a batch encoder, and text items encoded with it."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stoker.format.foreign.locations import LocationReader
from stoker.pack.token_sources import Item

#: A tokenizer given as a function: text in, token ids out.
Tokenizer = Callable[[str], Sequence[int]]
#: Texts handed to the tokenizer at once (a ``tokenizers`` file encodes them in parallel).
TOKENIZE_BATCH = 512


@dataclass(frozen=True, slots=True)
class Encoder:
    """A tokenizer made ready for batches: texts in, each text's ids out."""

    encode: Callable[[list[str]], list[Sequence[int]]]
    vocab_size: int | None
    description: str


def load_tokenizer(
    tokenizer: Tokenizer | str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> Encoder:
    """A batch encoder for ``tokenizer``: a function of one text, or the path or URL of a
    Hugging Face ``tokenizers`` JSON file (its special tokens are not added: give the
    end-of-text id as ``eos_id``).

    Raises:
        ImportError: A tokenizer file and no ``tokenizers`` package.
        TypeError: Neither a function nor a path.
    """
    if isinstance(tokenizer, str | os.PathLike):
        location = os.fspath(tokenizer)
        try:
            module = importlib.import_module("tokenizers")
        except ImportError as exc:
            raise ImportError(
                "a tokenizer file needs the tokenizers package: pip install 'stoker[tokenizers]'"
            ) from exc
        text = LocationReader(storage_options).read(location).decode("utf-8", "replace")
        try:
            loaded = module.Tokenizer.from_str(text)
        except Exception as exc:  # tokenizers raises its own Exception for a bad file
            raise ValueError(f"{location}: not a tokenizers JSON file: {exc}") from None

        def encode_file(texts: list[str]) -> list[Sequence[int]]:
            return [e.ids for e in loaded.encode_batch(texts, add_special_tokens=False)]

        size = int(loaded.get_vocab_size(with_added_tokens=True))
        return Encoder(encode_file, size, f"tokenizers {location} (vocabulary {size:,})")
    if not callable(tokenizer):
        raise TypeError(
            f"tokenizer must be a function of one text or a tokenizers JSON file, got "
            f"{type(tokenizer).__name__}"
        )

    def encode_each(texts: list[str]) -> list[Sequence[int]]:
        return [tokenizer(text) for text in texts]

    name = getattr(tokenizer, "__qualname__", type(tokenizer).__name__)
    return Encoder(encode_each, None, f"function {name}")


def tokenized(items: Iterable[Item], encoder: Encoder) -> Iterator[Item]:
    """``items`` with each text replaced by its ids, encoded in batches of
    :data:`TOKENIZE_BATCH`; a text the tokenizer fails on becomes an item with a problem
    (named with its document by :func:`~stoker.pack.tokens.pack_tokens`)."""
    batch: list[Item] = []
    for item in items:
        batch.append(item)
        if len(batch) >= TOKENIZE_BATCH:
            yield from _encode(batch, encoder)
            batch = []
    yield from _encode(batch, encoder)


def _encode(batch: list[Item], encoder: Encoder) -> Iterator[Item]:
    texts = [(n, item.value) for n, item in enumerate(batch) if isinstance(item.value, str)]
    try:
        encoded: list[Sequence[int] | Exception] = list(encoder.encode([t for _, t in texts]))
    except Exception:  # a tokenizer may raise anything: find the document
        encoded = [_encode_one(encoder, t) for _, t in texts]
    ids: dict[int, Any] = {n: e for (n, _), e in zip(texts, encoded, strict=True)}
    for n, item in enumerate(batch):
        value = ids.get(n)
        if isinstance(value, Exception):
            yield Item(item.key, item.source, problem=f"the tokenizer failed: {value!r}")
        elif n in ids:
            yield Item(item.key, item.source, value)
        else:
            yield item


def _encode_one(encoder: Encoder, text: str) -> Sequence[int] | Exception:
    try:
        return encoder.encode([text])[0]
    except Exception as exc:  # named with the document by the caller
        return exc
