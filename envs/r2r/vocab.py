"""Instruction tokenization from a vocab file (one token per line, VALAN's format).

Ids follow the file's line order. Words not in the vocab map to `<UNK>`; instructions are
cut or padded with `<PAD>` to a fixed length, so observations have one shape.
"""

from __future__ import annotations

import os
import re

import numpy as np

from fleetrl.envs.r2r.graph import DataError

PAD, UNK, EOS = "<PAD>", "<UNK>", "<EOS>"
# Words, and punctuation marks as tokens of their own ("left." -> "left", ".").
_TOKEN = re.compile(r"\w+|[^\w\s]")


class Vocab:
    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.ids = {token: i for i, token in enumerate(tokens)}
        for special in (PAD, UNK):
            if special not in self.ids:
                raise DataError(f"the vocab has no {special} token")
        self.pad_id, self.unk_id = self.ids[PAD], self.ids[UNK]
        self.eos_id = self.ids.get(EOS)

    @classmethod
    def read(cls, path: str) -> Vocab:
        if not os.path.exists(path):
            raise DataError(f"no vocab file {path}")
        with open(path) as f:
            return cls([line.rstrip("\n") for line in f if line.strip()])

    def __len__(self) -> int:
        return len(self.tokens)

    @staticmethod
    def split(text: str) -> list[str]:
        return _TOKEN.findall(text.lower())

    def encode(self, text: str, length: int) -> np.ndarray:
        """[length] int32 ids: the words, then <EOS> if the vocab has it, then padding."""
        ids = [self.ids.get(word, self.unk_id) for word in self.split(text)]
        if self.eos_id is not None:
            ids = ids[:length - 1] + [self.eos_id]
        ids = ids[:length]
        return np.array(ids + [self.pad_id] * (length - len(ids)), dtype=np.int32)

    def write(self, path: str) -> None:
        with open(path, "w") as f:
            f.write("\n".join(self.tokens) + "\n")
