"""One flow-VLA inference step on a CPU, with a pi0.5 at 1/8 of openpi's widths: the
attention kernels side by side, and how much of the step is spent outside the model.

    python -m fleetrl.bench.pi0_inference_step --batch_sizes=1,8 --rounds=3

The model keeps openpi's depths, heads, 224 px images, 200 prompt slots and horizon 10, at
1/8 of every width (Gemma 256 wide, the expert 128, SigLIP 144); LIBERO-shaped
observations (two cameras, an 8-dim state, a 66-byte instruction) go through
`FlowVLAAgent.step` as the learner's inference does (5 denoise steps, eval). For each batch
size and kernel (`attention=eager`, openpi's per-head copies and float32 softmax, against
`sdpa`), rounds alternate between the kernels; printed: the median ms a step, chunks/s,
and the share of the step outside the model's prefix and expert passes (the prompt, the
images' conversion, the sampler's arithmetic, the value head). Run the same file at an
older commit to compare code; figures are ratios within one sitting.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch
from absl import app, flags

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_list("batch_sizes", ["1", "8"], "Inference batch sizes.")
    flags.DEFINE_list("kernels", ["eager", "sdpa"], "Attention kernels, alternated.")
    flags.DEFINE_integer("rounds", 3, "Alternating rounds per kernel.")
    flags.DEFINE_integer("calls", 3, "Timed steps per round (after one untimed).")
    flags.DEFINE_integer("denoise_steps", 5, "Denoise steps per chunk.")
    flags.DEFINE_integer("threads", 0, "torch CPU threads; 0: torch's default.")


def eighth_config():
    from fleetrl.agents.pi0.model import GEMMA_VARIANTS, Pi0Config, SiglipSize

    def eighth(size, **extra):
        return dataclasses.replace(size, width=size.width // 8, mlp_dim=size.mlp_dim // 8,
                                   head_dim=size.head_dim // 8, **extra)

    return Pi0Config(pi05=True, paligemma=eighth(GEMMA_VARIANTS["gemma_2b"], vocab_size=16384),
                     expert=eighth(GEMMA_VARIANTS["gemma_300m"], vocab_size=16384),
                     vision=SiglipSize(1152 // 8, 27, 4304 // 8, 16), action_horizon=10, max_token_len=200)


class ModelClock:
    """Seconds spent inside the model's prefix and expert passes (wrapping the instance's
    two methods that the agent calls)."""

    def __init__(self, model):
        self.seconds = 0.0
        for name in ("prefix_cache", "velocity_and_states"):
            setattr(model, name, self._timed(getattr(model, name)))

    def _timed(self, function):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
        return timed


def main(argv) -> None:
    del argv
    from fleetrl.agents.pi0.agent_config import FlowVLAAgentConfig
    from fleetrl.agents.pi0.flow_vla_agent import BaseModel, FlowVLAAgent
    from fleetrl.agents.pi0.model import Pi0Model
    from fleetrl.bench.pi0_gpu import bench_tokenizer, observations

    if FLAGS.threads:
        torch.set_num_threads(FLAGS.threads)
    torch.manual_seed(0)
    model = Pi0Model(eighth_config()).eval()
    config = FlowVLAAgentConfig(model_path="eighth", chunk_size=5, denoise_steps=FLAGS.denoise_steps)
    agent = FlowVLAAgent(config, 7, ("main_image", "wrist_image"), base=BaseModel(model, bench_tokenizer(), None))
    agent.eval()
    clock = ModelClock(model)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"pi0.5 at 1/8 widths: {params:.0f} M parameters, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}")
    print("| batch | attention | ms a step | chunks/s | outside the model |")
    print("|---|---|---|---|---|")
    for batch in map(int, FLAGS.batch_sizes):
        obs = observations(batch, "cpu")
        first = torch.ones(batch, dtype=torch.bool)
        times: dict[str, list[float]] = {k: [] for k in FLAGS.kernels}
        outside: dict[str, list[float]] = {k: [] for k in FLAGS.kernels}
        for _ in range(FLAGS.rounds):
            for kernel in FLAGS.kernels:
                model.attention = kernel
                with torch.no_grad():
                    agent.step(obs, first, ())
                    for _ in range(FLAGS.calls):
                        clock.seconds = 0.0
                        started = time.perf_counter()
                        agent.step(obs, first, ())
                        seconds = time.perf_counter() - started
                        times[kernel].append(seconds)
                        outside[kernel].append(1 - clock.seconds / seconds)
        for kernel in FLAGS.kernels:
            seconds = statistics.median(times[kernel])
            print(f"| {batch} | {kernel} | {1000 * seconds:.0f} | {batch / seconds:.2f} | "
                  f"{100 * statistics.median(outside[kernel]):.1f}% |")


if __name__ == "__main__":
    define_flags()
    app.run(main)
