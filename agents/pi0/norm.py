"""A pi0 checkpoint's normalization statistics (openpi's `norm_stats.json`) and how they apply.

pi0 normalizes the state and the actions by z-score, (x - mean) / (std + 1e-6); pi0.5 by
quantiles, (x - q01) / (q99 - q01 + 1e-6) * 2 - 1. No clipping. The statistics have the
dataset's own widths (LIBERO: state 8, actions 7): normalizing uses the input's first
dims, and the model's output is unnormalized over the statistics' dims, the padding left
as it is (z-score pads mean 0 and std 1, as openpi does).

Where the file sits: `assets/<asset_id>/norm_stats.json` in openpi's folders,
`<asset_id>/norm_stats.json` in RLinf's (LIBERO's asset_id: physical-intelligence/libero).
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

EPS = 1e-6
FILE = "norm_stats.json"


@dataclasses.dataclass(frozen=True)
class Stats:
    mean: np.ndarray
    std: np.ndarray
    q01: np.ndarray | None = None
    q99: np.ndarray | None = None

    def to_json(self) -> dict:
        out = {"mean": self.mean.tolist(), "std": self.std.tolist()}
        if self.q01 is not None:
            out.update(q01=self.q01.tolist(), q99=self.q99.tolist())
        return out


@dataclasses.dataclass(frozen=True)
class NormStats:
    state: Stats
    actions: Stats

    def to_json(self) -> dict:
        return {"norm_stats": {"state": self.state.to_json(), "actions": self.actions.to_json()}}


def read_norm_stats(path: str) -> NormStats:
    """openpi's norm_stats.json; a ValueError naming the file and what it lacks."""
    try:
        with open(path) as f:
            stats = json.load(f)["norm_stats"]
        parsed = {}
        for name in ("state", "actions"):
            entry = stats[name]
            q = {k: np.asarray(entry[k], np.float64) for k in ("q01", "q99") if entry.get(k) is not None}
            parsed[name] = Stats(np.asarray(entry["mean"], np.float64), np.asarray(entry["std"], np.float64),
                                 q.get("q01"), q.get("q99"))
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not an openpi norm_stats.json ({type(e).__name__}: {e}); it holds "
                         '{"norm_stats": {"state": {"mean", "std", "q01", "q99"}, "actions": {...}}}') from None
    return NormStats(**parsed)


def find_norm_stats(model_path: str, asset_id: str = "") -> str | None:
    """The norm_stats.json of a checkpoint folder: under assets/<asset_id>/ (openpi) or
    <asset_id>/ (RLinf). Without an asset_id, the folder's only one; None when there is none."""
    if asset_id:
        for candidate in (os.path.join(model_path, "assets", asset_id, FILE), os.path.join(model_path, asset_id, FILE)):
            if os.path.isfile(candidate):
                return candidate
        raise ValueError(f"{model_path}: no {FILE} for asset_id {asset_id!r} (looked in assets/{asset_id}/ and "
                         f"{asset_id}/)")
    found = sorted(os.path.join(root, FILE) for root, _, files in os.walk(model_path) if FILE in files)
    if len(found) > 1:
        names = ", ".join(os.path.relpath(p, model_path) for p in found)
        raise ValueError(f"{model_path} holds several {FILE} ({names}): choose one with --asset_id")
    return found[0] if found else None


def write_norm_stats(stats: NormStats, folder: str, asset_id: str) -> str:
    path = os.path.join(folder, "assets", asset_id, FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(stats.to_json(), f, indent=2)
    return path


def discretize_state(normalized: np.ndarray, bins: int = 256) -> np.ndarray:
    """pi0.5's state in the prompt: 256 bins over [-1, 1] (int64; below -1 is -1, as openpi's)."""
    return np.digitize(normalized, np.linspace(-1.0, 1.0, bins + 1)[:-1]) - 1


def _need_quantiles(stats: Stats) -> None:
    if stats.q01 is None or stats.q99 is None:
        raise ValueError("quantile normalization (pi0.5) needs q01 and q99 in norm_stats.json; this file has "
                         "mean and std only")


class Normalizer:
    """The checkpoint's statistics on the model's device, for the agent's torch tensors: the
    state into the model, the model's actions out to the env, an oracle's chunk back in.
    `delta_dims`: pi0_libero's delta actions (the raw state's first dims added to the
    actions after unnormalizing). With no statistics, everything passes through."""

    def __init__(self, stats: NormStats | None, quantile: bool, delta_dims: int = 0):
        self.stats, self.quantile, self.delta_dims = stats, quantile, delta_dims
        self._on_device: dict[tuple[str, str], list] = {}  # uploaded once per device, not per call

    def _vectors(self, stats: Stats, like):
        import torch

        key = ("state" if stats is self.stats.state else "actions", str(like.device))
        if key not in self._on_device:
            names = ("q01", "q99") if self.quantile else ("mean", "std")
            if self.quantile:
                _need_quantiles(stats)
            self._on_device[key] = [torch.as_tensor(getattr(stats, n), dtype=torch.float32, device=like.device)
                                    for n in names]
        return self._on_device[key]

    def state(self, raw):
        """Normalized state (the statistics' first dims; x may be narrower)."""
        if self.stats is None:
            return raw
        a, b = (v[:raw.shape[-1]] for v in self._vectors(self.stats.state, raw))
        return (raw - a) / (b - a + EPS) * 2 - 1 if self.quantile else (raw - a) / (b + EPS)

    def env_actions(self, model_actions, raw_state):
        """The model's actions [..., D] (the task's dims) in the env's scale."""
        out = model_actions
        if self.stats is not None:
            a, b = (v[:out.shape[-1]] for v in self._vectors(self.stats.actions, out))
            d = a.shape[0]
            scaled = (out[..., :d] + 1) / 2 * (b - a + EPS) + a if self.quantile else out[..., :d] * (b + EPS) + a
            out = scaled if d == out.shape[-1] else torch_cat(scaled, out[..., d:])
        return self._delta(out, raw_state, +1)

    def model_actions(self, env_actions, raw_state):
        """An env-scale chunk [..., D] (an oracle's) in the model's scale: env_actions' inverse."""
        out = self._delta(env_actions, raw_state, -1)
        if self.stats is None:
            return out
        a, b = (v[:out.shape[-1]] for v in self._vectors(self.stats.actions, out))
        d = a.shape[0]
        scaled = (out[..., :d] - a) / (b - a + EPS) * 2 - 1 if self.quantile else (out[..., :d] - a) / (b + EPS)
        return scaled if d == out.shape[-1] else torch_cat(scaled, out[..., d:])

    def _delta(self, actions, raw_state, sign: int):
        if not self.delta_dims:
            return actions
        d = self.delta_dims
        shift = raw_state[..., :d].reshape(*raw_state.shape[:-1], *[1] * (actions.dim() - raw_state.dim()), d)
        return torch_cat(actions[..., :d] + sign * shift, actions[..., d:])


def torch_cat(first, second):
    import torch

    return torch.cat([first, second], dim=-1)
