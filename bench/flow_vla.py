"""The flow VLA's costs on the learner: denoising chunks/s by inference batch, with the
prefix's cache reused across denoise steps and with the prefix computed again at every
step (side by side, one process), and PPO update samples/s.

    python -m fleetrl.bench.flow_vla --batch_sizes=1,8,32 --hparams=model_path=tiny

It also prints the env's own steps/s (PointReach, numpy), to show the env is not the bound.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from absl import app, flags

from fleetrl.envs.action_chunks import ACTION_REWARDS, ACTIONS_EXECUTED
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.learner.training.trainer import Trainer
from fleetrl.losses.batch import UnrollBatch
from fleetrl.problems.registry import load_problem

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Here, not at import: other benches define flags of the same names."""
    flags.DEFINE_string("problem", "point_reach", "A flow-VLA Problem.")
    flags.DEFINE_list("hparams", [], "The Problem's settings, name=value.")
    flags.DEFINE_list("batch_sizes", ["1", "8", "32"], "Inference batch sizes.")
    flags.DEFINE_integer("repeats", 10, "Timed repeats per figure (after one untimed).")
    flags.DEFINE_integer("threads", 1, "torch intra-op threads (the learner's --torch_threads).")
    flags.DEFINE_string("device", "cpu", "cpu or cuda.")
    flags.DEFINE_integer("update_batch", 16, "Envs per PPO batch (unrolls of --unroll_length).")
    flags.DEFINE_integer("unroll_length", 8, "Steps per unroll in the PPO batch.")


def observations(problem, count: int, device: torch.device) -> dict[str, torch.Tensor]:
    env = problem.make_actor_env()
    obs = [env.reset(seed=i)[0] for i in range(count)]
    return {k: torch.from_numpy(np.stack([o[k] for o in obs])).to(device) for k in obs[0]}


def seconds_per_call(call, repeats: int) -> float:
    call()
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # the untimed call's kernels are not the timed ones'
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats


def env_steps_per_s(problem, steps: int = 5000) -> float:
    env = problem.make_env()
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (steps, *env.action_space.shape)).astype(np.float32)
    started = time.perf_counter()
    for action in actions:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - started)


def ppo_batch(problem, agent, batch: int, length: int, device: torch.device) -> UnrollBatch:
    """A batch of unrolls as the learner records them: real observations, sampled chains."""
    obs = observations(problem, batch, device)
    with torch.no_grad():
        out, _ = agent.step(obs, torch.ones(batch, dtype=torch.bool, device=device), ())
    policy = problem.action_policy()
    actions = policy.select_actor_action(out, obs, {})
    steps, k = length + 1, problem.config.chunk_size
    extras = {ACTION_REWARDS: torch.rand(steps, batch, k, device=device),
              ACTIONS_EXECUTED: torch.full((steps, batch), k, device=device)} if k > 1 else {}
    repeat = lambda x: x.unsqueeze(0).expand(steps, *x.shape).contiguous()  # noqa: E731
    return UnrollBatch(
        observation={k: repeat(v) for k, v in obs.items()}, action={k: repeat(v) for k, v in actions.items()},
        extras=extras, first=torch.zeros(steps, batch, dtype=torch.bool, device=device),
        reward=torch.rand(steps, batch, device=device), terminated=torch.zeros(steps, batch, dtype=torch.bool,
                                                                              device=device),
        truncated=torch.zeros(steps, batch, dtype=torch.bool, device=device),
        behaviour_log_prob=repeat(policy.action_log_prob(out, actions)), behaviour_value=repeat(out["baseline"]),
        policy_version=torch.zeros(steps, batch, dtype=torch.int64, device=device), initial_state=())


def main(argv) -> None:
    del argv
    torch.set_num_threads(FLAGS.threads)
    device = torch.device(FLAGS.device)
    problem = load_problem(FLAGS.problem, dict(item.split("=", 1) for item in FLAGS.hparams))
    torch.manual_seed(0)
    agent = problem.make_agent().to(device)
    c = problem.config
    print(f"{FLAGS.problem}: {c.denoise_steps} denoise steps, chunks of {c.chunk_size}, "
          f"{sum(p.numel() for p in agent.parameters()) / 1e6:.2f}M parameters "
          f"({sum(p.numel() for p in agent.parameters() if p.requires_grad) / 1e6:.2f}M trained), {device}")
    for size in map(int, FLAGS.batch_sizes):
        obs = observations(problem, size, device)
        first = torch.ones(size, dtype=torch.bool, device=device)
        timings = {}
        for reuse in (True, False):
            agent.reuse_prefix_cache = reuse
            with torch.inference_mode():
                timings[reuse] = seconds_per_call(lambda: agent.step(obs, first, ()), FLAGS.repeats)
        agent.reuse_prefix_cache = True
        print(f"batch {size:>3}: {size / timings[True]:8.1f} chunks/s with the prefix cached, "
              f"{size / timings[False]:8.1f} computing it at every denoise step: "
              f"{timings[False] / timings[True]:4.2f}x")
    batch = ppo_batch(problem, agent, FLAGS.update_batch, FLAGS.unroll_length, device)
    trainer = Trainer(problem, agent, problem.make_optimizer(agent.parameters()), PolicyVersion(), device)
    seconds = seconds_per_call(lambda: trainer.update(batch), max(1, FLAGS.repeats // 5))
    samples = FLAGS.update_batch * FLAGS.unroll_length * trainer.epochs
    print(f"PPO update: {samples / seconds:8.1f} samples/s ({FLAGS.update_batch} x {FLAGS.unroll_length} steps, "
          f"{trainer.epochs} epochs of {trainer.minibatches} minibatches, {seconds:.2f} s per batch)")
    if hasattr(problem, "make_env"):
        print(f"env alone: {env_steps_per_s(problem):8.0f} steps/s")
    if device.type == "cuda":
        print(f"peak CUDA memory: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    define_flags()
    app.run(main)
