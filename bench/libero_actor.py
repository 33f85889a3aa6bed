"""What one LIBERO actor's envs do on this machine: before and after the speed-ups, side by side.

    python bench/libero_actor.py speed  [--suite=libero_10] [--image_size=64] [--chunks=40] [--rounds=2]
    python bench/libero_actor.py resets [--suite=libero_10]
    python bench/libero_actor.py memory [--episodes=100]
    python bench/libero_actor.py render [--sizes=64,128,224,256] [--details=1,0.5,0.25,0.1]

"before" is LIBERO's defaults, and fleetrl's until the speed-ups: a rebuild at every reset
(twice on a task change), every camera rendered at every action and settling step, MSAA on.
"after" is LiberoEnv's defaults (soft resets, only the observations that leave the env
rendered, MSAA on). The others change one setting of "after": "pinned" episodes_per_task=10,
"no_msaa" msaa=False, "no_asset_cache" asset_cache=False, "light" mesh_detail=0.25 (visual
meshes keep a quarter of their faces), "light_no_msaa" both.

speed: the actor's env (chunks of 5) played with random chunks, 1 env in this process and
2 in subprocesses (as the actor steps them), every setting once per round, rounds
alternating, resets included (episodes capped at --max_episode_steps actions, a random
task at each reset unless pinned). Prints actions/s.
resets: seconds per reset keeping the task, and changing it.
memory: resident memory of an env process (VmRSS), each setting in a process of its own,
over --episodes episodes of one chunk, the tasks taken in turn: measured whenever task 0
was just reset (so every figure holds the same scene), after the first reset, after a
round of the 10 tasks and at the end; "one_task" resets task 0 only.
render: milliseconds per camera image at each size and mesh_detail, with MSAA and without: a
step that renders both cameras less a step that renders none, halved; and how far the first
observation's pixels are from those of the first setting.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from fleetrl.envs.action_chunks import ActionChunks
from fleetrl.envs.libero.env import LiberoEnv
from fleetrl.envs.vector import make_vector_env

CHUNK = 5
SETTINGS = {
    "before": {"soft_reset": False, "render_every_step": True},
    "after": {},
    "pinned": {"episodes_per_task": 10},
    "no_msaa": {"msaa": False},
    "light": {"mesh_detail": 0.25},
    "light_no_msaa": {"mesh_detail": 0.25, "msaa": False},
}
MEMORY_SETTINGS = {"before": SETTINGS["before"], "after": {}, "no_asset_cache": {"asset_cache": False},
                   "one_task": {"task_ids": (0,)}, "light": SETTINGS["light"]}


def actor_env(suite: str, image_size: int, max_episode_steps: int, **settings) -> ActionChunks:
    return ActionChunks(LiberoEnv(suite, image_size=image_size, max_episode_steps=max_episode_steps, **settings), CHUNK)


def resident_gb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1e6
    raise RuntimeError(f"no VmRSS for {pid}")


def actions_per_s(make_env, num_envs: int, chunks: int, seed: int) -> float:
    envs = make_vector_env(make_env, num_envs, asynchronous=num_envs > 1)
    rng = np.random.default_rng(seed)
    shape = (num_envs, CHUNK, 7)
    try:
        envs.reset(seed=[seed + i for i in range(num_envs)])
        envs.step(rng.uniform(-1, 1, shape).astype(np.float32))  # warm-up: numba compiles once
        actions, started = 0, time.perf_counter()
        for _ in range(chunks):
            _, _, _, _, info = envs.step(rng.uniform(-1, 1, shape).astype(np.float32))
            actions += int(np.sum(info.get("actions_executed", 0)))  # absent when every env reset
        return actions / (time.perf_counter() - started)
    finally:
        envs.close()


def speed(args) -> None:
    figures: dict[tuple[str, int], list[float]] = {}
    names = args.settings.split(",") if args.settings else list(SETTINGS)
    for round_ in range(args.rounds):
        for name in names:
            settings = SETTINGS[name]
            make_env = functools.partial(actor_env, args.suite, args.image_size, args.max_episode_steps, **settings)
            for num_envs in (int(n) for n in args.num_envs.split(",")):
                rate = actions_per_s(make_env, num_envs, args.chunks, seed=100 * round_)
                figures.setdefault((name, num_envs), []).append(rate)
                print(f"round {round_}: {name:15s} {num_envs} env(s): {rate:6.1f} actions/s", flush=True)
    print("\nactions/s, each round's figure:")
    for num_envs in (int(n) for n in args.num_envs.split(",")):
        base = statistics.mean(figures[(names[0], num_envs)])
        for name in names:
            rates = figures[(name, num_envs)]
            print(f"  {num_envs} env(s) {name:15s} " + ", ".join(f"{r:.1f}" for r in rates)
                  + f"  ({statistics.mean(rates) / base:.1f}x {names[0]})")


def resets(args) -> None:
    for name in ("before", "after", "light"):
        env = LiberoEnv(args.suite, task_ids=(0, 2), image_size=args.image_size, **SETTINGS[name])
        try:
            env.reset(seed=0, options={"task_index": 0, "trial": 0})
            kept, changed = [], []
            for i in range(args.resets):
                task = (i // 2 + 1) % 2  # changed, kept, changed, kept, ...
                started = time.perf_counter()
                env.reset(seed=i, options={"task_index": task, "trial": i + 1})
                (kept if i % 2 else changed).append(time.perf_counter() - started)
            print(f"{name:19s} reset keeping the task {statistics.mean(kept):.2f}s, changing it "
                  f"{statistics.mean(changed):.2f}s (means of {len(kept)} and {len(changed)})", flush=True)
        finally:
            env.close()


def memory(args) -> None:
    """Each setting in a fresh process of its own, as an actor's env process."""
    for name in args.settings.split(",") if args.settings else MEMORY_SETTINGS:
        subprocess.run([sys.executable, __file__, "memory_one", name, f"--suite={args.suite}",
                        f"--image_size={args.image_size}", f"--episodes={args.episodes}"], check=True)


def memory_one(args) -> None:
    """Episodes of one chunk, the tasks taken in turn (0, 1, ..., 9, 0, ...), or task 0 only
    ("one task"); the resident memory each time task 0 has just been reset: after the first
    reset, after one round of the tasks, and after `--episodes` episodes."""
    name = args.setting
    settings = dict(MEMORY_SETTINGS[name])
    tasks = settings.pop("task_ids", tuple(range(10)))
    env = ActionChunks(LiberoEnv(args.suite, task_ids=tasks, image_size=args.image_size, max_episode_steps=CHUNK,
                                 **settings), CHUNK)
    chunk = np.zeros((CHUNK, 7), np.float32)
    figures = []
    try:
        for episode in range(args.episodes + 1):
            index = episode % len(tasks)
            env.reset(seed=episode, options={"task_index": index, "trial": episode % 50})
            if episode in (0, len(tasks), args.episodes):
                figures.append(resident_gb(os.getpid()))
            env.step(chunk)
    finally:
        env.close()
    print(f"{name:21s} resident GB: {figures[0]:.2f} after the first reset, {figures[1]:.2f} after "
          f"{len(tasks)} more, {figures[2]:.2f} after {args.episodes} episodes", flush=True)


def render(args) -> None:
    for size in (int(s) for s in args.sizes.split(",")):
        full_detail: dict[str, np.ndarray] = {}
        for detail in (float(d) for d in args.details.split(",")):
            for msaa in (True, False):
                env = LiberoEnv(args.suite, task_ids=(0,), image_size=size, msaa=msaa, mesh_detail=detail)
                try:
                    first, _ = env.reset(seed=0, options={"task_index": 0, "trial": 0})
                    full_detail = full_detail or first
                    change = np.mean([np.abs(first[k].astype(int) - full_detail[k]).mean()
                                      for k in ("main_image", "wrist_image")])
                    faces = int(env._sim.env.sim.model._model.mesh_facenum.sum())
                    action = np.zeros(7, np.float32)
                    times = {True: [], False: []}
                    for i in range(2 * args.repeats):
                        wanted = bool(i % 2)
                        env.observation_wanted = wanted
                        started = time.perf_counter()
                        env.step(action)
                        times[wanted].append(time.perf_counter() - started)
                    per_camera = (statistics.median(times[True]) - statistics.median(times[False])) / 2
                    print(f"{size:4d} px, MSAA {'on ' if msaa else 'off'}, mesh_detail {detail:4.2f} ({faces} faces): "
                          f"{1000 * per_camera:6.1f} ms per camera image (a step without images "
                          f"{1000 * statistics.median(times[False]):.1f} ms); pixels differ from the first "
                          f"setting's by {change:.2f} of 255 on average", flush=True)
                finally:
                    env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("speed", "resets", "memory", "render", "memory_one"))
    parser.add_argument("setting", nargs="?", help="memory_one: which of the memory settings")
    parser.add_argument("--suite", default="libero_10")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=40, help="speed: timed chunks per setting")
    parser.add_argument("--rounds", type=int, default=2, help="speed: rounds of every setting, alternating")
    parser.add_argument("--settings", default="", help="speed and memory: which, comma-separated (default: "
                        "all; speed's first is the baseline)")
    parser.add_argument("--num_envs", default="1,2", help="speed: env counts")
    parser.add_argument("--max_episode_steps", type=int, default=100, help="speed: the episodes' cap, in actions")
    parser.add_argument("--resets", type=int, default=6, help="resets: how many, half of them changing the task")
    parser.add_argument("--episodes", type=int, default=100, help="memory: how many short episodes")
    parser.add_argument("--sizes", default="64,128,224,256", help="render: image sizes")
    parser.add_argument("--repeats", type=int, default=10, help="render: steps timed per size, each way")
    parser.add_argument("--details", default="1", help="render: mesh_detail values (the first is the reference "
                        "whose pixels the others are compared with)")
    args = parser.parse_args()
    if args.what != "memory_one":
        print(f"LIBERO {args.suite}; {os.cpu_count()} CPUs, MUJOCO_GL={os.environ.get('MUJOCO_GL', 'egl')}",
              flush=True)
    {"speed": speed, "resets": resets, "memory": memory, "render": render, "memory_one": memory_one}[args.what](args)


if __name__ == "__main__":
    main()
