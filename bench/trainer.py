"""The trainer alone: samples/s of `Trainer.update` on synthetic batches.

    python -m fleetrl.bench.trainer --problem=cartpole

The batches come from the learner's own inference step and state store, fed random
observations, so they have every field and shape a real run gives; nothing else runs.
Samples are transitions: T x B per update.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from absl import app, flags

from fleetrl.learner.inference.env_state_store import build_state_store
from fleetrl.learner.inference.inference_step import InferenceStep, StepRequest
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.learner.training.trainer import Trainer
from fleetrl.losses.batch import UnrollBatch
from fleetrl.problems.registry import load_problem

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("problem", "cartpole", "Problem whose agent and loss are trained.")
    flags.DEFINE_list("hparams", [], "name=value overrides of the Problem's config.")
    flags.DEFINE_integer("unroll_length", 20, "T.")
    flags.DEFINE_list("batch_sizes", ["8", "32"], "B of each measurement.")
    flags.DEFINE_float("measure_s", 10.0, "Seconds measured per batch size.")
    flags.DEFINE_integer("repeats", 2, "Measurements per batch size.")


def synthetic_batches(problem, agent, unroll_length: int, batch_size: int, count: int = 4) -> list[UnrollBatch]:
    """`count` batches of unrolls that the inference step recorded from random observations."""
    store = build_state_store(problem, agent, unroll_length, torch.device("cpu"))
    unrolls: list = []
    inference = InferenceStep(problem, agent, PolicyVersion(), store, lambda u: unrolls.append(u) or True,
                              torch.device("cpu"))
    rng = np.random.default_rng(0)
    slots, run_ids = store.allocate(batch_size), np.arange(1, batch_size + 1, dtype=np.uint64)
    while len(unrolls) < count * batch_size:
        observation = {s.name: (rng.integers(0, 256, (batch_size, *s.shape)) if s.dtype.kind in "ui"
                                else rng.normal(size=(batch_size, *s.shape))).astype(s.dtype)
                       for s in problem.observation_specs()}
        inference([StepRequest(
            slots=slots, run_ids=run_ids, observation=observation,
            extras={s.name: np.zeros((batch_size, *s.shape), s.dtype) for s in problem.extra_specs()},
            reward=rng.normal(size=batch_size).astype(np.float32), terminated=rng.uniform(size=batch_size) < 0.05,
            truncated=np.zeros(batch_size, bool))])
    return [UnrollBatch.collate(unrolls[i * batch_size:(i + 1) * batch_size]) for i in range(count)]


def main(argv: list[str]) -> None:
    del argv
    torch.set_num_threads(1)  # as the learner's trainer thread (--torch_threads)
    problem = load_problem(FLAGS.problem, dict(h.split("=", 1) for h in FLAGS.hparams))
    agent = problem.make_agent()
    trainer = Trainer(problem, agent, problem.make_optimizer(agent.parameters()), PolicyVersion(), torch.device("cpu"))
    print(f"fleetrl trainer: {FLAGS.problem} ({trainer.algorithm.__class__.__name__}, {trainer.epochs} epochs x "
          f"{trainer.minibatches} minibatches), T={FLAGS.unroll_length}, {os.cpu_count()} CPUs, 1 torch thread",
          flush=True)
    for batch_size in (int(b) for b in FLAGS.batch_sizes):
        batches = synthetic_batches(problem, agent, FLAGS.unroll_length, batch_size)
        for batch in batches[:2]:  # warm-up
            trainer.update(batch)
        for run in range(FLAGS.repeats):
            updates, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < FLAGS.measure_s:
                trainer.update(batches[updates % len(batches)])
                updates += 1
            samples = updates * FLAGS.unroll_length * batch_size
            print(f"  B={batch_size:4d} run {run}: {samples / elapsed:10,.0f} samples/s "
                  f"({1000 * elapsed / updates:.2f} ms per update)", flush=True)


if __name__ == "__main__":
    define_flags()
    app.run(main)
