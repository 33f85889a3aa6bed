"""Double-buffered actors against plain ones: env steps/s and batch fill, side by side.

    python -m fleetrl.bench.env_groups

Runs `launch.local` (training on) for each fleet, once with `--env_groups=1` and once
with 2, alternating, `--repeats` times, and prints env steps/s and the mean inference
batch as a share of the connected envs. The default fleets are the ones the actor's
`--env_groups` default was chosen from.
"""

from __future__ import annotations

import os

from absl import app, flags

from fleetrl.bench.throughput import full_system

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_list("fleets", ["cartpole:2x32", "cartpole:16x4", "gym_cards/ezpoints:2x8"],
                      "problem:ACTORSxENVS of each fleet measured.")
    flags.DEFINE_list("env_groups", ["1", "2"], "The --env_groups values compared.")
    flags.DEFINE_integer("repeats", 2, "Runs of each (fleet, env_groups), alternating.")
    flags.DEFINE_float("warmup_s", 8.0, "Seconds before measuring.")
    flags.DEFINE_float("measure_s", 20.0, "Seconds measured.")
    flags.DEFINE_float("inference_timeout_ms", 5.0, "The learner's batch timeout.")


def main(argv: list[str]) -> None:
    del argv
    print(f"fleetrl env groups: {os.cpu_count()} CPUs, training on, {FLAGS.warmup_s:g}s warm-up, "
          f"{FLAGS.measure_s:g}s measured, batch timeout {FLAGS.inference_timeout_ms:g} ms", flush=True)
    print(f"{'fleet':>22} {'groups':>6} {'run':>3} {'env steps/s':>12} {'mean batch':>10} {'fill':>6}", flush=True)
    for fleet in FLAGS.fleets:
        problem, sizes = fleet.split(":")
        actors, envs = (int(x) for x in sizes.split("x"))
        for run in range(FLAGS.repeats):
            for groups in FLAGS.env_groups:
                rate, batch, _ = full_system(problem, actors, envs, 20, 8, FLAGS.warmup_s, FLAGS.measure_s,
                                             f"--env_groups={groups}",
                                             f"--inference_timeout_ms={FLAGS.inference_timeout_ms}")
                print(f"{fleet:>22} {groups:>6} {run:>3} {rate:12,.0f} {batch:10.1f} {batch / (actors * envs):6.0%}",
                      flush=True)


if __name__ == "__main__":
    define_flags()
    app.run(main)
