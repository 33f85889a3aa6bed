"""What the tiny models built offline share: a cache folder named by a hash of what goes
into the model, written aside and renamed (so processes that build the same model at once
share one copy), and a byte-level BPE tokenizer trained on the caller's corpus."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from fleetrl.common.extras import MissingExtra


def cache_dir() -> str:
    return os.environ.get("FLEETRL_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "fleetrl"))


def built_once(name: str, recipe: Any, write: Callable[[str], None], root: str | None = None) -> str:
    """The folder `<root>/<name>-<hash of recipe>`, made by `write(folder)` if missing.

    `write` may seed torch's global RNG (the same recipe, the same weights): it runs on a
    fork of that RNG, so a caller's random stream never depends on whether the cache was
    warm (two runs of one seed diverged when only the first built the model)."""
    import torch

    digest = hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:16]
    path = os.path.join(root or cache_dir(), f"{name}-{digest}")
    if os.path.isdir(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}-", dir=os.path.dirname(path))
    try:
        with torch.random.fork_rng(devices=[]):
            write(staging)
        os.rename(staging, path)
    except OSError:
        if not os.path.isdir(path):  # not another process that got there first: a real failure
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def byte_level_bpe(corpus: Sequence[str], vocab_size: int, special_tokens: Sequence[str], what: str):
    """A `tokenizers` byte-level BPE trained on `corpus`, the special tokens first."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError as e:
        raise MissingExtra(what, "vlm", e) from e
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(list(corpus), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return bpe
