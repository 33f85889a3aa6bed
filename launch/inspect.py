"""What a run's recorded batches hold.

Usage: python -m fleetrl.launch.inspect LOGDIR/recorded_unrolls.npz

Prints each field of a `--record_unrolls` file (shape, dtype, min, mean, max, NaN count; a
histogram of actions), then flags the mistakes that most often keep a new Problem from
learning: rewards that never vary (all 0, or the same in episodes that are only ever
truncated), observations that never change, episodes that never end, actions outside the
action space, log-probs of -inf, and NaNs. Exit code: 0 when nothing is flagged, 1 when
something is, 2 when the file cannot be read. docs/debugging.md.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import numpy as np
from absl import app

Arrays = Mapping[str, np.ndarray]


def read(path: str) -> dict[str, np.ndarray]:
    """The named arrays of a recorded file; ValueError naming what is wrong with it."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e} (write one with --record_unrolls=N)") from None
    missing = {"reward", "terminated", "truncated", "first", "behaviour_log_prob"} - arrays.keys()
    if missing:
        raise ValueError(f"{path} is not a --record_unrolls file: it has no {', '.join(sorted(missing))}")
    return arrays


def findings(arrays: Arrays) -> list[str]:
    """One sentence for each mistake found, naming the field."""
    found = []
    transitions = ~arrays["first"]  # a first step's reward belongs to no transition of its episode
    rewards = arrays["reward"][transitions]
    # A constant reward teaches nothing when it is 0, or when episodes end only by truncation
    # (every return is then the same); CartPole's 1 per step, in episodes that end, is fine.
    truncated_only = arrays["truncated"].any() and not arrays["terminated"].any()
    if rewards.size and np.all(rewards == rewards.flat[0]) and (rewards.flat[0] == 0 or truncated_only):
        found.append(f"reward: all {rewards.size:,} rewards are {rewards.flat[0]:g}"
                     f"{'' if rewards.flat[0] == 0 else ' and no episode terminates'}: the agent has nothing to "
                     "learn from. Do the conditions under which the env pays a reward ever hold where step "
                     "computes it?")
    for key, value in arrays.items():
        if key.startswith("observation/") and not key.startswith("observation/prev_action/"):
            steps = value.reshape(value.shape[0], value.shape[1], value.shape[2], -1)  # [N, T+1, B, features]
            if value.shape[1] > 1 and np.all(steps == steps[:, :1]):
                unrolls = value.shape[0] * value.shape[2]
                found.append(f"{key}: never changes within an unroll (in any of the {unrolls:,} recorded): does the "
                             "env return its new observation, or a stale copy?")
    ended = arrays["terminated"] | arrays["truncated"]
    if not ended.any():
        found.append(f"terminated, truncated: no episode ended in {ended.size:,} steps. A missing time limit "
                     "(max_episode_steps) or a done that is never set? (Or episodes longer than what was recorded.)")
    for key, value in arrays.items():
        if key.startswith("space/action/") and key.endswith("/low"):
            name = key[len("space/action/"):-len("/low")]
            actions, high = arrays.get(f"action/{name}"), arrays[f"space/action/{name}/high"]
            if actions is None:
                continue
            outside = (actions < value) | (actions > high)
            if outside.any():
                hint = ("a discrete action the env does not have" if np.issubdtype(actions.dtype, np.integer)
                        else "continuous actions the env must clip: does it, or should the policy squash them?")
                found.append(f"action/{name}: {int(outside.sum()):,} of {outside.size:,} values lie outside the "
                             f"action space [{value.min():g}, {high.max():g}]: {hint}")
    log_prob = arrays["behaviour_log_prob"]
    if np.isneginf(log_prob).any():
        found.append(f"behaviour_log_prob: {int(np.isneginf(log_prob).sum()):,} are -inf: the policy took actions "
                     "it gives probability 0 (an action mask that excludes them, or actions outside its support?)")
    for key, value in arrays.items():
        if np.issubdtype(value.dtype, np.floating) and np.isnan(value).any():
            found.append(f"{key}: {int(np.isnan(value).sum()):,} NaNs")
    return found


def describe(key: str, value: np.ndarray) -> list[str]:
    """A field's lines: shape, dtype and statistics; for actions, their histogram."""
    line = f"{key:<36} {str(list(value.shape)):<24} {str(value.dtype):<8}"
    if value.dtype == bool or np.issubdtype(value.dtype, np.number):
        numbers = value.astype(np.float64)
        finite = numbers[np.isfinite(numbers)]
        if finite.size:
            line += f" min {finite.min():<10.4g} mean {finite.mean():<10.4g} max {finite.max():<10.4g}"
        line += f" NaN {int(np.isnan(numbers).sum())}"
    lines = [line]
    if key.startswith("action/") and np.issubdtype(value.dtype, np.number) and value.size:
        if np.issubdtype(value.dtype, np.integer) and np.unique(value).size <= 20:
            values, counts = np.unique(value, return_counts=True)
            lines.append("    histogram " + "  ".join(f"{v}: {c:,}" for v, c in zip(values, counts)))
        else:
            counts, edges = np.histogram(value[np.isfinite(value)], bins=10)
            lines.append("    histogram " + "  ".join(f"[{a:.3g}, {b:.3g}): {c:,}"
                                                     for a, b, c in zip(edges[:-1], edges[1:], counts)))
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m fleetrl.launch.inspect FILE (a run's recorded_unrolls.npz)", file=sys.stderr)
        return 2
    try:
        arrays = read(argv[1])
    except ValueError as e:
        print(f"fleetrl: {e}", file=sys.stderr)
        return 2
    n, t1, b = arrays["reward"].shape
    print(f"{argv[1]}: {n} batches of {b} unrolls of {t1} steps ([N, T+1, B, ...]; loss/* are [N, T, B])")
    for key in sorted(arrays, key=lambda k: (k.startswith("space/"), k)):
        print("\n".join(describe(key, arrays[key])))
    found = findings(arrays)
    print(f"\n{len(found)} thing(s) to look at:" if found else "\nnothing flagged")
    for sentence in found:
        print(f"  - {sentence}")
    return 1 if found else 0


def run() -> None:
    app.run(lambda argv: sys.exit(main(argv)))


if __name__ == "__main__":
    run()
