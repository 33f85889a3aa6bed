"""pi0's prompts as openpi writes and tokenizes them.

The text is stripped, with "_" and newlines made spaces, and tokenized with BOS first.
pi0's format (and pi0.5's without `discrete_state_input`, as `pi05_libero`) then appends
the separately tokenized "\\n" (the start of the answer). pi0.5 with
`discrete_state_input` writes the normalized state, in 256 bins, into the prompt:
"Task: <text>, State: <ints>;\\nAction: ". Token ids are right-padded with 0 to
`max_token_len` (cut beyond it), with a mask of the real tokens.

`PromptTokenizer` is what the agent runs per inference step and training pass: each
distinct instruction (bytes, as the env sends them) is tokenized once and kept, and the
batch's ids are cut to its longest real prompt, rounded up to `bucket` slots. Padded slots
are neither keys nor positions, so the cut changes no output, only the prefix's cost
(LIBERO's instructions fill 20-40 of pi0.5's 200 slots).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fleetrl.agents.pi0.norm import discretize_state


def prompt_text(task: str, state: np.ndarray | None = None) -> tuple[str, bool]:
    """(the prompt, whether a separate "\\n" follows it) for one sample; `state` is the
    normalized state for pi0.5's discrete state input, else None."""
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    if state is None:
        return cleaned, True
    return f"Task: {cleaned}, State: {' '.join(map(str, discretize_state(state)))};\nAction: ", False


def tokenize_prompts(tokenizer, tasks: Sequence[str], max_token_len: int,
                     states: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ids [B, max_token_len] int64, mask [B, max_token_len] bool) for `tasks` (and the
    normalized `states` [B, D] for pi0.5's discrete state input)."""
    bos = tokenizer.bos_token_id
    newline = tokenizer.encode("\n", add_special_tokens=False)
    ids = np.zeros((len(tasks), max_token_len), np.int64)
    mask = np.zeros((len(tasks), max_token_len), bool)
    for i, task in enumerate(tasks):
        text, answer_start = prompt_text(task, None if states is None else states[i])
        tokens = [bos, *tokenizer.encode(text, add_special_tokens=False)] + (newline if answer_start else [])
        tokens = tokens[:max_token_len]
        ids[i, :len(tokens)] = tokens
        mask[i, :len(tokens)] = True
    return ids, mask


class PromptTokenizer:
    """openpi's prompts for a batch of instructions as bytes [B, L] uint8 (zero-padded),
    each distinct instruction tokenized once (at most `capacity` kept). pi0.5's discrete
    state input writes the state into the text, so those prompts are tokenized per sample."""

    def __init__(self, tokenizer, max_token_len: int, bucket: int = 8, capacity: int = 65536):
        if bucket < 1:
            raise ValueError(f"the prompt bucket must be at least 1 slot, not {bucket}")
        self.tokenizer, self.max_token_len, self.bucket, self.capacity = tokenizer, max_token_len, bucket, capacity
        self._ids: dict[bytes, list[int]] = {}

    def __call__(self, language: np.ndarray, states: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids [B, W] int64, mask [B, W] bool), W the longest prompt rounded up to the bucket."""
        if states is not None:
            ids, mask = tokenize_prompts(self.tokenizer, [_text(row) for row in language], self.max_token_len, states)
            return self._cut(ids, mask)
        unique, inverse = np.unique(language, axis=0, return_inverse=True)
        rows = [self._tokens(row) for row in unique]
        ids = np.zeros((len(unique), self.max_token_len), np.int64)
        for i, tokens in enumerate(rows):
            ids[i, :len(tokens)] = tokens
        lengths = np.array([len(t) for t in rows])
        mask = np.arange(self.max_token_len)[None] < lengths[:, None]
        inverse = inverse.reshape(-1)
        return self._cut(ids[inverse], mask[inverse])

    def _tokens(self, row: np.ndarray) -> list[int]:
        key = row.tobytes().rstrip(b"\0")
        tokens = self._ids.get(key)
        if tokens is None:
            ids, mask = tokenize_prompts(self.tokenizer, [_text(row)], self.max_token_len)
            tokens = ids[0, :mask[0].sum()].tolist()
            if len(self._ids) >= self.capacity:  # a stream of ever-new instructions: start again
                self._ids.clear()
            self._ids[key] = tokens
        return tokens

    def _cut(self, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        longest = int(mask.sum(1).max()) if len(mask) else 0
        width = min(self.max_token_len, max(self.bucket, math.ceil(longest / self.bucket) * self.bucket))
        return ids[:, :width], mask[:, :width]


def _text(row: np.ndarray) -> str:
    return bytes(row).rstrip(b"\0").decode("utf-8", errors="replace")
