"""Learning curves of the algorithms side by side: same Problem, same env-step budget, same seed.

    python -m fleetrl.bench.learning_curves --total_env_steps=500000 --seed=0

Runs `fleetrl.launch.local` once per algorithm, one after the other on this machine, and
prints the mean training-episode return around each milestone (from the TensorBoard
`episode/return` summaries), the final mean over the last 100 episodes, and the wall
time. The README's side-by-side table comes from this script.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
from absl import app, flags
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

FLAGS = flags.FLAGS


def define_flags() -> None:
    """At the entry point only, so that importing this module defines no flags."""
    flags.DEFINE_string("problem", "cartpole", "Problem to train.")
    flags.DEFINE_integer("total_env_steps", 500_000, "The budget of every run.")
    flags.DEFINE_integer("milestones", 5, "How many points of each curve to print.")
    flags.DEFINE_integer("seed", 0, "Seed of every run.")
    flags.DEFINE_list("algorithms", ["vtrace", "ppo", "grpo"], "Which of ALGORITHM_FLAGS to run.")

# The settings the README reports for each algorithm on CartPole.
ALGORITHM_FLAGS = {
    "vtrace": ["--hparams=algorithm=vtrace"],
    "ppo": ["--hparams=algorithm=ppo", "--block_inference_on_training", "--batch_size=32", "--unroll_length=16"],
    "grpo": ["--hparams=algorithm=grpo,group_size=8"],
}


def curve(logdir: pathlib.Path, milestones: list[int], window: int) -> list[float]:
    """The mean of the `episode/return` summaries in (m - window, m], per milestone m."""
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    points = [(e.step, e.value) for e in events.Scalars("episode/return")]
    out = []
    for m in milestones:
        values = [v for step, v in points if m - window < step <= m]
        out.append(float(np.mean(values)) if values else float("nan"))
    return out


def main(argv) -> None:
    del argv
    budget = FLAGS.total_env_steps
    milestones = [budget * (i + 1) // FLAGS.milestones for i in range(FLAGS.milestones)]
    window = budget // FLAGS.milestones // 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in FLAGS.algorithms:
            logdir = pathlib.Path(tmp) / name
            command = [sys.executable, "-m", "fleetrl.launch.local", f"--problem={FLAGS.problem}",
                       f"--seed={FLAGS.seed}", f"--total_env_steps={budget}", "--summary_interval_s=1",
                       f"--logdir={logdir}", *ALGORITHM_FLAGS[name]]
            print(" ".join(command[1:]), flush=True)
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            summary = json.loads((logdir / "summary.json").read_text())
            rows.append((name, curve(logdir, milestones, window), summary["mean_episode_return"], summary["wall_s"]))

    header = ["algorithm", *[f"{m // 1000}k" for m in milestones], "final (last 100)", "wall s"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name, points, final, wall in rows:
        cells = [name, *[f"{p:.0f}" for p in points], f"{final:.0f}", f"{wall:.0f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    define_flags()
    app.run(main)
