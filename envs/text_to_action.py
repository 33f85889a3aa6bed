"""Text to action, as RL4VLM parses a vision-language model's answer.

Lowercase the text and look after `"action":`. Every legal action string that occurs
there is a match. Exactly one distinct match is the action. Otherwise the action is a
uniformly random legal one, and the result says the parse failed (Problems count the rate).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

MARKER = '"action":'


@dataclasses.dataclass
class ParsedAction:
    index: int  # into the legal actions
    parse_failed: bool


def text_to_action(text: str, legal_actions: Sequence[str], rng: np.random.Generator) -> ParsedAction:
    lowered = text.lower()
    at = lowered.find(MARKER)
    tail = lowered[at + len(MARKER):] if at >= 0 else ""
    matches = {i for i, action in enumerate(legal_actions) if _occurs(action.lower(), tail)}
    if len(matches) == 1:
        return ParsedAction(matches.pop(), False)
    return ParsedAction(int(rng.integers(len(legal_actions))), True)


def _occurs(action: str, text: str) -> bool:
    """Whole numbers and words only: "1" does not occur in "10", nor "hit" in "white"."""
    if action.isdigit():
        return re.search(rf"(?<!\d){action}(?!\d)", text) is not None
    if action.isalpha():
        return re.search(rf"\b{action}\b", text) is not None
    return action in text
