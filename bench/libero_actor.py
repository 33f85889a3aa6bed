"""What one LIBERO actor can do on this machine: env steps/s and memory per env process.

    python bench/libero_actor.py [--suite=libero_10] [--image_size=64] [--num_envs=1,2] [--steps=40]

For each `num_envs` it builds the actor's vector env the way the actor does (in-process for
one env, else one subprocess per env), plays random chunks of 5 actions for `--steps`
agent steps after a warm-up, and prints actions/s (simulator steps), resets included, and
each env process's resident memory now and at its peak (VmRSS, VmHWM).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from fleetrl.envs.vector import make_vector_env
from fleetrl.problems import load_problem


def memory_gb(pid: int) -> tuple[float, float]:
    """(resident now, resident peak) of `pid`, in GB."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1e6, int(fields["VmHWM"].split()[0]) / 1e6


def measure(problem, num_envs: int, steps: int) -> None:
    asynchronous = problem.envs_in_subprocesses and num_envs > 1
    envs = make_vector_env(problem.make_actor_env, num_envs, asynchronous)
    rng = np.random.default_rng(0)
    try:
        started = time.perf_counter()
        envs.reset(seed=list(range(num_envs)))
        first_reset = time.perf_counter() - started
        chunk_shape = (num_envs, *envs.single_action_space.shape)
        envs.step(rng.uniform(-1, 1, chunk_shape).astype(np.float32))  # warm-up (numba compiles once)
        actions, episodes, started = 0, 0, time.perf_counter()
        for _ in range(steps):
            _, _, terminated, truncated, info = envs.step(rng.uniform(-1, 1, chunk_shape).astype(np.float32))
            actions += int(np.sum(info.get("actions_executed", problem.config.chunk_size)))
            episodes += int(np.sum(terminated | truncated))
        elapsed = time.perf_counter() - started
        pids = [p.pid for p in envs.processes] if asynchronous else [os.getpid()]
        memory = [memory_gb(pid) for pid in pids]
    finally:
        envs.close()
    where = "subprocesses" if asynchronous else "in-process"
    print(f"{num_envs} env(s), {where}: first reset {first_reset:.1f}s; {actions / elapsed:.1f} actions/s "
          f"({steps * num_envs / elapsed:.2f} chunks/s, {episodes} episodes ended), over {elapsed:.0f}s")
    for pid, (now, peak) in zip(pids, memory):
        print(f"  env process {pid}: {now:.2f} GB resident, peak {peak:.2f} GB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="libero_10")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--num_envs", default="1,2")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--max_episode_steps", type=int, default=100)
    args = parser.parse_args()
    problem = load_problem("libero", {"suite": args.suite, "image_size": str(args.image_size),
                                      "max_episode_steps": str(args.max_episode_steps)})
    print(f"LIBERO {args.suite}, {args.image_size}px main and wrist cameras, chunks of {problem.config.chunk_size}, "
          f"episodes capped at {args.max_episode_steps} actions; {os.cpu_count()} CPUs, "
          f"MUJOCO_GL={os.environ.get('MUJOCO_GL', 'egl')}")
    for num_envs in (int(n) for n in args.num_envs.split(",")):
        measure(problem, num_envs, args.steps)


if __name__ == "__main__":
    main()
