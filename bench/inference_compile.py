"""Does `torch.compile` pay for the learner's inference step? Eager and compiled, side by side.

    python -m fleetrl.bench.inference_compile --problems=cartpole,gym_cards/ezpoints --batch_sizes=1,16,64

For each Problem and batch size: the inference step's model work (`Problem.agent_step`,
the action sample and its log-prob, as `inference.InferenceStep` runs them, under
`torch.inference_mode`) on random observations of the Problem's specs, eager and through
`torch.compile(dynamic=True)`, alternating rounds of `--calls` calls each. Printed: the
median ms per call of each, their ratio, and the compile time (the first compiled call).
One torch thread, as the learner's inference thread on CPU.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
import torch
from absl import app, flags

from fleetrl.learner.inference.env_state_store import build_state_store
from fleetrl.problems.registry import load_problem

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_list("problems", ["cartpole", "gym_cards/ezpoints"], "Problems whose agents are timed.")
    flags.DEFINE_list("batch_sizes", ["1", "16", "64"], "Envs per inference batch.")
    flags.DEFINE_integer("calls", 100, "Calls per round.")
    flags.DEFINE_integer("rounds", 4, "Rounds of each, alternating.")


def step_fn(problem, agent):
    policy = problem.action_policy()

    def step(observation, first, state):
        out, new_state = problem.agent_step(agent, observation, first, state, {})
        actions = policy.select_actor_action(out, observation, {})
        return actions, policy.action_log_prob(out, actions), new_state

    return step


def inputs(problem, agent, batch_size: int, rng: np.random.Generator):
    """What `InferenceStep` hands the agent for a batch of fresh envs: observations with
    the previous actions, `first` flags and the recurrent state, from the state store."""
    store = build_state_store(problem, agent, 0, torch.device("cpu"), record=False)
    slots = store.allocate(batch_size)
    first, state, prev_action = store.lookup(slots, np.arange(1, batch_size + 1, dtype=np.uint64))
    observation = {s.name: torch.from_numpy((rng.integers(0, 256, (batch_size, *s.shape)) if s.dtype.kind in "ui"
                                             else rng.normal(size=(batch_size, *s.shape))).astype(s.dtype))
                   for s in problem.observation_specs()}
    observation.update({f"prev_action/{k}": v for k, v in prev_action.items()})
    return observation, torch.from_numpy(first), state


def time_calls(fn, args, calls: int) -> float:
    """Median ms per call."""
    times = []
    with torch.inference_mode():
        for _ in range(calls):
            started = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main(argv: list[str]) -> None:
    del argv
    torch.set_num_threads(1)
    print(f"inference step, eager vs torch.compile(dynamic=True): {os.cpu_count()} CPUs, one torch thread, "
          f"{FLAGS.rounds} alternating rounds of {FLAGS.calls} calls", flush=True)
    print(f"{'problem':<20} {'batch':>5} | {'eager ms':>9} {'compiled ms':>11} {'ratio':>6} | {'compile s':>9}")
    for name in FLAGS.problems:
        problem = load_problem(name)
        agent = problem.make_agent().eval()
        eager = step_fn(problem, agent)
        compiled = torch.compile(eager, dynamic=True)
        rng = np.random.default_rng(0)
        for batch_size in (int(b) for b in FLAGS.batch_sizes):
            args = inputs(problem, agent, batch_size, rng)
            started = time.perf_counter()
            with torch.inference_mode():
                compiled(*args)
            compile_s = time.perf_counter() - started
            eager_ms, compiled_ms = [], []
            for _ in range(FLAGS.rounds):
                eager_ms.append(time_calls(eager, args, FLAGS.calls))
                compiled_ms.append(time_calls(compiled, args, FLAGS.calls))
            e, c = statistics.median(eager_ms), statistics.median(compiled_ms)
            print(f"{name:<20} {batch_size:>5} | {e:>9.3f} {c:>11.3f} {e / c:>5.2f}x | {compile_s:>9.1f}", flush=True)


if __name__ == "__main__":
    define_flags()
    app.run(main)
