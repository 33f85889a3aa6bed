"""Where each generated token ends in the answer's UTF-8 bytes, from a per-token table.

A byte-level BPE tokenizer (GPT-2's, Llama 3's, Qwen's, the tiny VLM's) spells each byte of
a token as one character, so a token's byte length is its string's length, and an
answer's byte offsets are a running sum: no decoding of prefixes. Special tokens decode to
nothing (answers are decoded with skip_special_tokens); other added tokens to their content.
For any other tokenizer the table is None, and callers decode prefixes instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def token_byte_lengths(tokenizer) -> np.ndarray | None:
    """[vocab] bytes each token id adds to a decoded answer, or None if not byte-level BPE."""
    from tokenizers import decoders

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    lengths = np.zeros(len(tokenizer), np.int64)
    for token, index in tokenizer.get_vocab().items():
        lengths[index] = len(token)
    for index, added in tokenizer.added_tokens_decoder.items():
        lengths[index] = 0 if added.special else len(added.content.encode("utf-8"))
    return lengths


def tokens_through(lengths: np.ndarray, answer: Sequence[int], byte_end: int) -> int:
    """The fewest of `answer`'s tokens whose bytes reach `byte_end`."""
    ends = np.cumsum(lengths[np.asarray(answer, np.int64)])
    return int(np.searchsorted(ends, byte_end)) + 1
