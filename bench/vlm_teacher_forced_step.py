"""The learner's inference step for a VLM warm start (every episode teacher-forced), with and
without generation for the forced envs, side by side in one process.

    python -m fleetrl.bench.vlm_teacher_forced_step --batch_sizes=8,16

Teacher-forced episodes play the oracle's answer, so the step skips generation for them
(`VLMProblem.agent_step`) and runs one forward pass of the prompts for their values. This
prints ms per batch both ways, the other being what the step cost before (generation for
every env), and the ratio. It also prints the answer decoding's cost per answer with the
tokenizer's byte offsets and with the prefix search they replace.
"""

from __future__ import annotations

import time

import torch
from absl import app, flags

from fleetrl.bench.vlm_generation import observations
from fleetrl.problems.registry import load_problem

# --problem, --hparams, --batch_sizes, --repeats and --threads are vlm_generation's flags.
FLAGS = flags.FLAGS


def per_batch_ms(step, repeats: int) -> float:
    step()
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    return 1000 * (time.perf_counter() - started) / repeats


def main(argv) -> None:
    del argv
    torch.set_num_threads(FLAGS.threads)
    hparams = dict(item.split("=", 1) for item in FLAGS.hparams)
    problem = load_problem(FLAGS.problem, {**hparams, "teacher_forcing_fraction": "1"})
    agent = problem.make_agent()
    for size in map(int, FLAGS.batch_sizes):
        obs = observations(problem, size)
        first, forced = torch.ones(size, dtype=torch.bool), torch.ones(size, dtype=torch.bool)
        with torch.inference_mode():
            skipping = per_batch_ms(lambda: problem.agent_step(agent, obs, first, (), {"teacher_forcing": forced}),
                                    FLAGS.repeats)
            generating = per_batch_ms(lambda: agent.step(obs, first, ()), FLAGS.repeats)
        print(f"batch {size:>3}: generating for every env {generating:8.1f} ms, skipping the forced ones "
              f"{skipping:7.1f} ms: {generating / skipping:5.1f}x")
    with torch.inference_mode():
        out, _ = agent.step(observations(problem, 32), torch.ones(32, dtype=torch.bool), ())
    table = agent._token_bytes
    for name, bytes_table in (("byte offsets", table), ("prefix search", None)):
        agent._token_bytes = bytes_table
        ms = per_batch_ms(lambda: agent._describe(out["tokens"], out["num_tokens"]), 20)
        print(f"decoding 32 answers with {name:<13}: {ms:6.2f} ms")
    agent._token_bytes = table


if __name__ == "__main__":
    app.run(main)
