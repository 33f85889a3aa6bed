"""Generation and PPO-update speed of a vision-language agent, in one process.

    python -m fleetrl.bench.vlm_generation --problem=gym_cards/numberline_vlm --batch_sizes=1,8,16,64

For each batch size: batched generation of `max_new_tokens` (the learner's inference step
for that many envs; sampled, as in training) in new tokens/s and ms per batch, and one
teacher-forced PPO update over the same answers in samples/s, with the peak memory of the
device (on a CPU, what a generation added to the process's resident memory at its peak).
`--device=cuda` runs it on a GPU; `--hparams` sets the Problem's config (a
`--hparams=model_path=/models/llava-v1.6-mistral-7b-hf`, say).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from absl import app, flags

from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.learner.training.trainer import Trainer
from fleetrl.losses.batch import UnrollBatch
from fleetrl.problems.registry import load_problem

flags.DEFINE_string("problem", "gym_cards/numberline_vlm", "A VLM Problem.")
flags.DEFINE_list("hparams", [], "The Problem's config, as name=value.")
flags.DEFINE_list("batch_sizes", ["1", "8", "16", "64"], "Envs per generation batch.")
flags.DEFINE_integer("repeats", 3, "Timed batches per size, after one warm-up.")
flags.DEFINE_string("device", "cpu", "cpu or cuda.")
flags.DEFINE_integer("threads", 1, "torch threads on CPU (the learner's inference runs on one).")
FLAGS = flags.FLAGS


def proc_status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def reset_peak_resident() -> int:
    """Resets the process's peak resident memory (Linux's clear_refs) and returns the
    resident memory now, for a CPU's peak: torch's allocator keeps no statistics there."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return proc_status_bytes("VmRSS")


def observations(problem, count: int) -> dict[str, torch.Tensor]:
    envs = [problem.make_actor_env() for _ in range(count)]
    obs = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    return {k: torch.from_numpy(np.stack([o[k] for o in obs])) for k in obs[0]}


def one_step_batch(problem, obs, out) -> UnrollBatch:
    """Two steps per env (an unroll of T=1): the answers, zero rewards, all valid."""
    count = len(out["num_tokens"])
    actions = {k: out[k] for k in ("tokens", "num_tokens", "thought_tokens", "text", "text_length")}
    log_prob = problem.action_policy().action_log_prob(out, actions)
    twice = lambda x: torch.stack([x, x]).cpu()  # noqa: E731
    return UnrollBatch(
        observation={k: twice(v) for k, v in obs.items()}, action={k: twice(v) for k, v in actions.items()},
        extras={}, first=torch.zeros(2, count, dtype=torch.bool), reward=torch.zeros(2, count),
        terminated=torch.zeros(2, count, dtype=torch.bool), truncated=torch.zeros(2, count, dtype=torch.bool),
        behaviour_log_prob=twice(log_prob), behaviour_value=twice(out["baseline"]),
        policy_version=torch.zeros(2, count, dtype=torch.int64), initial_state=())


def main(argv: list[str]) -> None:
    del argv
    torch.set_num_threads(FLAGS.threads)
    device = torch.device(FLAGS.device)
    problem = load_problem(FLAGS.problem, dict(h.split("=", 1) for h in FLAGS.hparams))
    torch.manual_seed(0)
    agent = problem.make_agent().to(device)
    trainer = Trainer(problem, agent, problem.make_optimizer(agent.parameters()), PolicyVersion(), device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"{FLAGS.problem}: {sum(p.numel() for p in agent.parameters()):,} parameters "
          f"({sum(p.numel() for p in agent.parameters() if p.requires_grad):,} trained), "
          f"max_new_tokens {problem.config.max_new_tokens}, device {device}")
    print(f"{'batch':>5} | {'new tokens/s':>12} | {'ms/batch':>8} | {'tokens/answer':>13} | "
          f"{'update samples/s':>16} | {'peak memory':>11}")
    for size in (int(s) for s in FLAGS.batch_sizes):
        obs = {k: v.to(device) for k, v in observations(problem, size).items()}
        first = torch.zeros(size, dtype=torch.bool, device=device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        tokens, seconds, update_seconds = 0.0, 0.0, 0.0
        generation_peak = 0
        for repeat in range(FLAGS.repeats + 1):
            sync()
            before = reset_peak_resident() if device.type == "cpu" else 0
            started = time.perf_counter()
            with torch.no_grad():
                out, _ = agent.step(obs, first, ())
            sync()
            generated = time.perf_counter()
            if device.type == "cpu":
                generation_peak = max(generation_peak, proc_status_bytes("VmHWM") - before)
            trainer.update(one_step_batch(problem, {k: v.cpu() for k, v in obs.items()}, out))
            sync()
            if repeat:  # the first is warm-up
                tokens += float(out["num_tokens"].sum())
                seconds += generated - started
                update_seconds += time.perf_counter() - generated
        agent.inference_metrics()  # drained: the bench times generation itself
        if device.type == "cuda":
            peak = f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
        else:  # what a generation added at its peak to the process's resident memory
            peak = f"+{generation_peak / 2**20:.0f} MiB"
        print(f"{size:>5} | {tokens / seconds:>12,.0f} | {1000 * seconds / FLAGS.repeats:>8.0f} | "
              f"{tokens / (size * FLAGS.repeats):>13.1f} | {size * FLAGS.repeats / update_seconds:>16.1f} | "
              f"{peak:>11}")


if __name__ == "__main__":
    app.run(main)
