"""fleetrl against Sample Factory 2.1.1 on CartPole-v1, side by side.

    make bench-peers

Sample Factory pins numpy<2 and gymnasium 0.29, so it lives in its own virtualenv
(`.venv-peers`, built by `make bench-peers`) and runs as a subprocess of that Python.
The two systems alternate, `--runs` times each, on the same machine in one sitting:

- Sample Factory: APPO with the command below (the one that works on 2 cores), stopped
  when its average episode reward first reaches the target. Its `--train_for_seconds`
  does nothing for this, so the script reads its log.
- fleetrl: what `make run` runs, which stops itself at the target.

For each run it prints env steps/s (Sample Factory's own 10-second FPS readings,
averaged; fleetrl's env steps over its learner's wall time), the env steps at which
the target was reached, and the wall time to it from the command's start, start-up
included.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

from absl import app, flags

FLAGS = flags.FLAGS

SAMPLE_FACTORY_FLAGS = ["--algo=APPO", "--use_rnn=False", "--num_envs_per_worker=20",
                        "--policy_workers_per_policy=2", "--recurrence=1", "--with_vtrace=False", "--batch_size=512",
                        "--reward_scale=0.1", "--env=CartPole-v1", "--device=cpu"]
_FPS = re.compile(r"Fps is \(10 sec: ([^,]+),.*Total num frames: (\d+)")
_REWARD = re.compile(r"Avg episode reward: \[\(0, '([-0-9.e+]+)'\)\]")


def define_flags() -> None:
    flags.DEFINE_string("peers_python", ".venv-peers/bin/python", "The Python that has Sample Factory 2.1.1.")
    flags.DEFINE_integer("runs", 2, "Runs of each system, alternating.")
    flags.DEFINE_float("target", 475.0, "The mean episode return both systems train to.")
    flags.DEFINE_integer("max_env_steps", 1_000_000, "Either system stops here if it has not reached the target.")
    flags.DEFINE_float("timeout_s", 600.0, "Longest run, in seconds.")


class Result(NamedTuple):
    env_steps_per_s: float
    env_steps: int  # at the target, or when stopped
    wall_s: float  # from the command's start
    reached: bool


def sample_factory(train_dir: str) -> Result:
    command = [FLAGS.peers_python, "-m", "sf_examples.train_gym_env", *SAMPLE_FACTORY_FLAGS,
               f"--train_for_env_steps={FLAGS.max_env_steps}", f"--train_dir={train_dir}", "--experiment=cartpole"]
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    fps, frames, reached = [], 0, False
    try:
        for line in process.stdout:
            if match := _FPS.search(line):
                frames = int(match[2])
                if match[1] != "nan" and float(match[1]) > 0:
                    fps.append(float(match[1]))
            elif (match := _REWARD.search(line)) and float(match[1]) >= FLAGS.target:
                reached = True
                break
            if time.monotonic() - start > FLAGS.timeout_s:
                break
        wall = time.monotonic() - start
    finally:
        _stop(process)
    return Result(sum(fps) / max(len(fps), 1), frames, wall, reached)


def fleetrl(logdir: str) -> Result:
    command = [sys.executable, "-m", "fleetrl.launch.local", "--problem=cartpole", f"--logdir={logdir}",
               "--num_actors=2", "--envs_per_actor=32", f"--total_env_steps={FLAGS.max_env_steps}",
               f"--target_mean_return={FLAGS.target}"]
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        process.wait(timeout=FLAGS.timeout_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        _stop(process)
    wall = time.monotonic() - start
    with open(os.path.join(logdir, "summary.json")) as f:
        summary = json.load(f)
    return Result(summary["env_steps"] / summary["wall_s"], summary["env_steps"], wall, summary["target_reached"])


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def main(argv: list[str]) -> None:
    del argv
    if not os.path.exists(FLAGS.peers_python):
        sys.exit(f"no Sample Factory Python at {FLAGS.peers_python}: `make bench-peers` builds it")
    print(f"CartPole-v1 to a mean return of {FLAGS.target:g}: {os.cpu_count()} CPUs, {FLAGS.runs} runs each, "
          "alternating", flush=True)
    print(f"{'system':>16} {'run':>3} {'env steps/s':>12} {'env steps':>10} {'wall s':>7} reached", flush=True)
    results: dict[str, list[Result]] = {"Sample Factory": [], "fleetrl": []}
    for run in range(FLAGS.runs):
        for name, system in (("Sample Factory", sample_factory), ("fleetrl", fleetrl)):
            with tempfile.TemporaryDirectory() as directory:
                result = system(directory)
            results[name].append(result)
            print(f"{name:>16} {run:>3} {result.env_steps_per_s:12,.0f} {result.env_steps:10,} {result.wall_s:7.1f} "
                  f"{result.reached}", flush=True)

    def mean(name: str, field: str) -> float:
        return sum(getattr(r, field) for r in results[name]) / len(results[name])

    print("fleetrl / Sample Factory: "
          f"throughput {mean('fleetrl', 'env_steps_per_s') / mean('Sample Factory', 'env_steps_per_s'):.2f}x, "
          f"env steps to the target {mean('fleetrl', 'env_steps') / mean('Sample Factory', 'env_steps'):.2f}x, "
          f"wall time to the target {mean('fleetrl', 'wall_s') / mean('Sample Factory', 'wall_s'):.2f}x")


if __name__ == "__main__":
    define_flags()
    app.run(main)
