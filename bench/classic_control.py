"""Does a user's Problem learn with the defaults? Classic control, beside CleanRL's PPO.

    python -m fleetrl.bench.classic_control                       # or: make bench-classic
    python -m fleetrl.bench.classic_control --envs=Acrobot-v1 --seeds=3

Each env trains twice with `launch.local` and no flag but the budget and the seed:
- `gym`: the generic Problem, `--problem=gym --env_id=...` (its defaults: V-trace);
- `docs example`: the Problem of docs/problems.md, its code block copied verbatim into a
  temporary package, with only the env id and `MLPAgent`'s input and output sizes replaced
  for envs other than its own Acrobot-v1 (its defaults: PPO).

Per run it prints the mean return of the last 100 training episodes at the end, beside
CleanRL's published `ppo.py` figure at its budget of 500k env steps (docs.cleanrl.dev,
rl-algorithms/ppo: mean ± std over its seeds). LunarLander-v3 runs when Box2D imports
(`pip install -e '.[box2d]'`, which `make bench-classic` does); CleanRL publishes no
`ppo.py` figure for it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

import gymnasium as gym
import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS

# CleanRL ppo.py, 500k env steps (docs.cleanrl.dev/rl-algorithms/ppo/#experiment-results).
CLEANRL_PPO = {"CartPole-v1": "490.04 ± 6.12", "Acrobot-v1": "-86.36 ± 1.32", "MountainCar-v0": "-200.00 ± 0.00"}
DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "problems.md")


def define_flags() -> None:
    flags.DEFINE_list("envs", ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "LunarLander-v3"], "Gymnasium env ids.")
    flags.DEFINE_list("problems", ["gym", "docs_example"], "Which Problems to train on each env.")
    flags.DEFINE_integer("env_steps", 500_000, "Env steps per run (CleanRL's classic-control budget).")
    flags.DEFINE_integer("seeds", 1, "Seeds 0 .. seeds-1 per env and Problem.")


class Run(NamedTuple):
    final: float
    env_steps: int
    wall_s: float


def docs_example(env_id: str, package_dir: str) -> str:
    """Writes docs/problems.md's example Problem for `env_id` as a package under
    `package_dir`; returns its --problem import path."""
    with open(DOCS) as f:
        code = re.search(r"```python\n(# my_pkg/nav.py\n.*?)```", f.read(), re.S).group(1)
    env = gym.make(env_id)
    sizes = f"MLPAgent({int(np.prod(env.observation_space.shape))}, {env.action_space.n},"
    env.close()
    code = code.replace('"Acrobot-v1"', f'"{env_id}"')
    code, replaced = re.subn(r"MLPAgent\(\d+, \d+,", sizes, code)
    if replaced != 1 or f'"{env_id}"' not in code:
        raise RuntimeError(f"{DOCS}: the example Problem no longer has the shape this bench rewrites")
    os.makedirs(os.path.join(package_dir, "my_pkg"), exist_ok=True)
    open(os.path.join(package_dir, "my_pkg", "__init__.py"), "w").close()
    with open(os.path.join(package_dir, "my_pkg", "nav.py"), "w") as f:
        f.write(code)
    return "my_pkg.nav:MyProblem"


def train(env_id: str, problem: str, seed: int) -> Run:
    with tempfile.TemporaryDirectory() as tmp:
        if problem == "gym":
            flags_ = ["--problem=gym", f"--env_id={env_id}"]
        else:
            flags_ = [f"--problem={docs_example(env_id, tmp)}"]
        logdir = os.path.join(tmp, "run")
        start = time.monotonic()
        subprocess.run([sys.executable, "-m", "fleetrl.launch.local", *flags_, f"--seed={seed}", f"--logdir={logdir}",
                        f"--total_env_steps={FLAGS.env_steps}"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": tmp})
        wall = time.monotonic() - start
        with open(os.path.join(logdir, "summary.json")) as f:
            summary = json.load(f)
    return Run(summary["mean_episode_return"], summary["env_steps"], wall)


def available(env_id: str) -> bool:
    try:
        gym.make(env_id).close()
        return True
    except (gym.error.Error, ImportError) as e:
        print(f"{env_id}: skipped ({type(e).__name__}: {e})", flush=True)
        return False


def main(argv: list[str]) -> None:
    del argv
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    envs = [env_id for env_id in FLAGS.envs if available(env_id)]
    print(f"classic control: {FLAGS.env_steps:,} env steps per run, {FLAGS.seeds} seed(s), defaults only, "
          f"{os.cpu_count()} CPUs", flush=True)
    print(f"{'env':<16} {'problem':<13} {'final (last 100 episodes)':<28} {'wall':>7}  CleanRL ppo.py", flush=True)
    for env_id in envs:
        for problem in FLAGS.problems:
            runs = [train(env_id, problem, seed) for seed in range(FLAGS.seeds)]
            finals = [r.final for r in runs]
            spread = f" ± {statistics.stdev(finals):.1f}" if len(finals) > 1 else ""
            shown = f"{statistics.mean(finals):.1f}{spread}" + (f" ({', '.join(f'{f:.0f}' for f in finals)})"
                                                                 if len(finals) > 1 else "")
            wall = statistics.mean(r.wall_s for r in runs)
            print(f"{env_id:<16} {problem.replace('_', ' '):<13} {shown:<28} {wall:6.0f}s  "
                  f"{CLEANRL_PPO.get(env_id, 'not published')}", flush=True)


if __name__ == "__main__":
    define_flags()
    app.run(main)
