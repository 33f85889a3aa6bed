"""Random and oracle (shortest-path) policies on an R2R split, for the README's comparison.

    python bench/r2r_baselines.py [--data_dir=data/r2r_synthetic] [--split=val_unseen]

The random policy picks uniformly among the valid slots (STOP included) at every step.
"""

from __future__ import annotations

import argparse

import numpy as np

from fleetrl.problems import load_problem


def play(env, split: str, policy, rng) -> dict[str, float]:
    totals: dict[str, list[float]] = {}
    for index in range(len(env.episodes[split])):
        obs, _ = env.reset(options={"split": split, "index": index})
        done = False
        while not done:
            obs, _, terminated, truncated, info = env.step(policy(obs, rng))
            done = terminated or truncated
        for name, value in info["metrics"].items():
            totals.setdefault(name, []).append(value)
    return {name: float(np.mean(values)) for name, values in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", default="data/r2r_synthetic")
    parser.add_argument("--split", default="val_unseen")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    env = load_problem("r2r", {"data_dir": args.data_dir}).make_env()
    random = [play(env, args.split, lambda o, rng: int(rng.choice(np.flatnonzero(o["candidate_mask"]))),
                   np.random.default_rng(seed)) for seed in range(args.seeds)]
    oracle = play(env, args.split, lambda o, rng: int(o["oracle_action"]), None)
    print(f"{args.split}: {len(env.episodes[args.split])} instructions")
    print(f"{'policy':<10} {'SR':>6} {'SPL':>6} {'nDTW':>6}")
    for name, m in (("random", {k: np.mean([r[k] for r in random]) for k in random[0]}), ("oracle", oracle)):
        print(f"{name:<10} {m['SR']:>6.3f} {m['SPL']:>6.3f} {m['nDTW']:>6.3f}")


if __name__ == "__main__":
    main()
