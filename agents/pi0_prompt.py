"""pi0's prompts as openpi writes and tokenizes them.

The text is stripped, with "_" and newlines made spaces, and tokenized with BOS first.
pi0's format (and pi0.5's without `discrete_state_input`, as `pi05_libero`) then appends
the separately tokenized "\\n" (the start of the answer). pi0.5 with
`discrete_state_input` writes the normalized state, in 256 bins, into the prompt:
"Task: <text>, State: <ints>;\\nAction: ". Token ids are right-padded with 0 to
`max_token_len` (cut beyond it), with a mask of the real tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fleetrl.agents.pi0_norm import discretize_state


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
