"""Env steps per second: the full system against the in-process limit, side by side.

    python -m fleetrl.bench.throughput --num_actors=2 --envs_per_actor=32

1. Full system: `fleetrl.launch.local` in real processes (a learner and the actors, over
   gRPC), training on. Measured from the learner's GetStatus after a warm-up.
2. In-process limit: the same envs, model, inference step, state store and trainer in one
   process and one thread, with no gRPC, no batching thread and no actor processes.

Both run for the same time, one after the other, on the same machine. The ratio says what
the distributed machinery costs (or, with more cores than one process can use, gains).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import numpy as np
import torch
from absl import app, flags

from fleetrl.actor.extras import vector_extras
from fleetrl.envs.vector import make_vector_env
from fleetrl.learner.inference.env_state_store import build_state_store
from fleetrl.learner.inference.inference_step import InferenceStep, StepRequest
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.learner.training.trainer import Trainer
from fleetrl.losses.batch import UnrollBatch
from fleetrl.problems.registry import load_problem
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc

FLAGS = flags.FLAGS


def define_flags() -> None:
    """At the entry point only, so that importing this module defines no flags."""
    flags.DEFINE_string("problem", "cartpole", "Problem to measure.")
    flags.DEFINE_integer("num_actors", 2, "Actor processes in the full system.")
    flags.DEFINE_integer("envs_per_actor", 32, "Envs per actor.")
    flags.DEFINE_integer("unroll_length", 20, "T.")
    flags.DEFINE_integer("batch_size", 8, "B.")
    flags.DEFINE_float("warmup_s", 10.0, "Seconds before measuring.")
    flags.DEFINE_float("measure_s", 30.0, "Seconds measured.")


def full_system(problem: str, num_actors: int, envs_per_actor: int, unroll_length: int, batch_size: int,
                warmup_s: float, measure_s: float, *launch_flags: str) -> tuple[float, float, int]:
    """(env steps/s, mean inference batch size, trainer steps) of launch.local, with
    `launch_flags` added to its command line."""
    with tempfile.TemporaryDirectory() as logdir:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "fleetrl.launch.local", f"--problem={problem}", f"--logdir={logdir}",
             f"--num_actors={num_actors}", f"--envs_per_actor={envs_per_actor}",
             f"--unroll_length={unroll_length}", f"--batch_size={batch_size}",
             f"--inference_batch_size={num_actors * envs_per_actor}", "--progress_interval_s=5", *launch_flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            address_file = os.path.join(logdir, "learner_address")
            while not os.path.exists(address_file):
                if launcher.poll() is not None:
                    raise RuntimeError("launch.local exited early")
                time.sleep(0.2)
            with open(address_file) as f, grpc.insecure_channel(f.read().strip()) as channel:
                stub = pb_grpc.LearnerStub(channel)
                status = lambda: stub.GetStatus(pb.StatusRequest(), timeout=5)  # noqa: E731
                while status().connected_actors < num_actors or status().env_steps == 0:
                    time.sleep(0.2)
                time.sleep(warmup_s)
                start, t0 = status(), time.monotonic()
                time.sleep(measure_s)
                end, t1 = status(), time.monotonic()
            return (end.env_steps - start.env_steps) / (t1 - t0), end.mean_inference_batch_size, end.trainer_steps
        finally:
            launcher.send_signal(signal.SIGINT)
            launcher.wait(timeout=60)


def in_process() -> tuple[float, int]:
    """(env steps/s, trainer steps) of the same work in one process and one thread."""
    torch.set_num_threads(1)
    problem = load_problem(FLAGS.problem)
    num_envs = FLAGS.num_actors * FLAGS.envs_per_actor
    agent = problem.make_agent()
    policy = PolicyVersion()
    trainer = Trainer(problem, agent, problem.make_optimizer(agent.parameters()), policy, torch.device("cpu"))
    store = build_state_store(problem, agent, FLAGS.unroll_length, torch.device("cpu"))
    unrolls: list = []
    inference = InferenceStep(problem, agent, policy, store, lambda u: unrolls.append(u) or True, torch.device("cpu"))
    envs = make_vector_env(problem.make_actor_env, num_envs)
    obs, info = envs.reset(seed=list(range(num_envs)))
    action_specs, extra_specs = problem.action_specs(), problem.extra_specs()
    slots, run_ids = store.allocate(num_envs), np.arange(1, num_envs + 1, dtype=np.uint64)
    reward, terminated, truncated = np.zeros(num_envs, np.float32), np.zeros(num_envs, bool), np.zeros(num_envs, bool)
    measure_from = time.monotonic() + FLAGS.warmup_s
    steps0 = None
    while True:
        now = time.monotonic()
        if steps0 is None and now >= measure_from:
            steps0, t0 = inference.env_steps, now
        if steps0 is not None and now - t0 >= FLAGS.measure_s:
            return (inference.env_steps - steps0) / (now - t0), policy.version
        # As the actor does: a Dict observation space gives a dict of arrays, any other one array.
        observation = obs if isinstance(obs, dict) else {"observation": obs}
        (actions,) = inference([StepRequest(slots=slots, run_ids=run_ids, observation=observation,
                                            extras=vector_extras(info, extra_specs, num_envs),
                                            reward=reward.astype(np.float32), terminated=terminated,
                                            truncated=truncated)])
        obs, reward, terminated, truncated, info = envs.step(
            actions[action_specs[0].name] if len(action_specs) == 1 else actions)
        while len(unrolls) >= FLAGS.batch_size:
            trainer.update(UnrollBatch.collate(unrolls[:FLAGS.batch_size]))
            del unrolls[:FLAGS.batch_size]


def main(argv: list[str]) -> None:
    del argv
    print(f"fleetrl throughput: {FLAGS.problem}, {FLAGS.num_actors} actors x {FLAGS.envs_per_actor} envs, "
          f"T={FLAGS.unroll_length}, B={FLAGS.batch_size}, {os.cpu_count()} CPUs, training on; "
          f"{FLAGS.warmup_s:g}s warm-up, {FLAGS.measure_s:g}s measured each", flush=True)
    full, batch, full_train = full_system(FLAGS.problem, FLAGS.num_actors, FLAGS.envs_per_actor,
                                          FLAGS.unroll_length, FLAGS.batch_size, FLAGS.warmup_s, FLAGS.measure_s)
    print(f"  full system (learner + {FLAGS.num_actors} actor processes, gRPC): {full:9,.0f} env steps/s "
          f"(mean inference batch {batch:.1f} envs, {full_train} trainer steps)", flush=True)
    alone, alone_train = in_process()
    print(f"  in-process limit (one process, no gRPC):            {alone:9,.0f} env steps/s "
          f"({alone_train} trainer steps)")
    print(f"  ratio full / in-process: {full / alone:.2f}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
