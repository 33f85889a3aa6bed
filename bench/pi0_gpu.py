"""A real-size pi0.5 on a GPU, alone and as the whole system: `make bench-gpu`.

    python -m fleetrl.bench.pi0_gpu --folder=/tmp/pi05 --batch_sizes=1,8,64 --update_batch=32

0. The chip: its measured bfloat16 matrix TFLOP/s (float32 on a CPU), so that each figure
   is also a fraction of it (the FLOPs of a chunk counted by torch's FlopCounterMode).
1. Writes a random-initialized pi0.5 at openpi's sizes (Gemma 2B prefix, 300M expert,
   So400m SigLIP, horizon 10) as openpi's `model.safetensors` (every tensor bfloat16, the
   tied embedding as the lm_head, the expert's lm_head too), unless the folder has one.
2. Loads it with `load_pi0(dtype=bfloat16)` in fresh processes, to the CPU and to the GPU:
   the time, peak host memory against the file's size, and peak GPU memory.
3. Denoises chunks (5 steps, 2 cameras and a 200-slot prompt as LIBERO's) by batch size.
4. PPO update samples/s through `FlowVLAAgent`: the expert trained alone (RLinf's
   default), and with LoRA on the prefix as well.
5. The whole system (`bench.pi0_fleet`): `launch.local` with the learner on the device
   serving that model to `--fleet_actors` actor processes over gRPC, PPO on, a
   LIBERO-shaped env almost free to step: chunks/s end to end, the GPU's busy fraction,
   the batch fill, PPO samples/s while serving, and the ratio to the model alone's
   chunks/s at the batch the fleet filled.
Figures print as they come, then one table. --size=tiny runs every step on a CPU
(tests/test_bench_pi0_gpu.py runs it); nothing is installed or downloaded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import torch
from absl import app, flags

from fleetrl.bench.flow_vla import seconds_per_call

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Here, not at import: other benches define flags of the same names."""
    flags.DEFINE_string("folder", "/tmp/fleetrl-pi05", "Where the checkpoint is written and read.")
    flags.DEFINE_enum("size", "real", ["real", "tiny"], "openpi's sizes, or the fixture's tiny ones (a CPU check).")
    flags.DEFINE_list("batch_sizes", ["1", "8", "64"], "Denoising batch sizes.")
    flags.DEFINE_integer("denoise_steps", 5, "Denoise steps per chunk.")
    flags.DEFINE_integer("update_batch", 32, "Samples (chunks) per PPO update.")
    flags.DEFINE_integer("repeats", 5, "Timed repeats per figure (after one untimed).")
    flags.DEFINE_integer("lora_rank", 32, "LoRA rank on the prefix for the second PPO figure.")
    flags.DEFINE_integer("fleet_actors", 12, "Actor processes of the whole-system run (0: no such run).")
    flags.DEFINE_integer("fleet_envs_per_actor", 8, "Envs each actor steps.")
    flags.DEFINE_integer("fleet_inference_batch", 64, "The learner's inference batch size in that run.")
    flags.DEFINE_float("fleet_warmup_s", 90.0, "Seconds the whole system runs before its figures are taken.")
    flags.DEFINE_float("fleet_measure_s", 60.0, "Seconds over which they are taken.")
    flags.DEFINE_boolean("fleet_block_inference_on_training", False, "The learner's setting of that name: "
                         "inference waits while PPO trains (false: they share the device).")


def model_config(size: str):
    from fleetrl.agents.pi0.model import GEMMA_VARIANTS, Pi0Config, SiglipSize

    if size == "real":
        return Pi0Config(pi05=True, action_horizon=10, max_token_len=200)
    tiny = GEMMA_VARIANTS["dummy"]
    return Pi0Config(pi05=True, paligemma=dataclasses.replace(tiny, vocab_size=1024),
                     expert=dataclasses.replace(tiny, width=32, mlp_dim=64, vocab_size=1024),
                     vision=SiglipSize(32, 2, 64, 2), action_horizon=10, max_token_len=200)


def write_checkpoint(folder: str, size: str, device: str) -> float:
    """openpi's layout, every tensor bfloat16; returns the seconds taken."""
    from safetensors.torch import save_file

    from fleetrl.agents.pi0.checkpoint import EMBEDDING, EXPERT_LM_HEAD, LM_HEAD
    from fleetrl.agents.pi0.model import Pi0Model

    started = time.perf_counter()
    os.makedirs(folder, exist_ok=True)
    config = model_config(size)
    with torch.device(device):
        model = Pi0Model(config).to(torch.bfloat16)
    weights = {(LM_HEAD if k == EMBEDDING else k): v.to("cpu").contiguous() for k, v in model.state_dict().items()}
    weights[EXPERT_LM_HEAD] = torch.zeros(config.paligemma.vocab_size, config.expert.width, dtype=torch.bfloat16)
    del model
    save_file(weights, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:  # openpi's fields; the tiny one's sizes
        raw = {"action_dim": 32, "action_horizon": 10, "paligemma_variant": "gemma_2b",
               "action_expert_variant": "gemma_300m", "precision": "bfloat16"}
        if size == "tiny":
            raw.update(paligemma=dataclasses.asdict(config.paligemma), action_expert=dataclasses.asdict(config.expert),
                       vision={"hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
                               "num_attention_heads": 2, "image_size": 224, "patch_size": 14})
        json.dump(raw, f)
    return time.perf_counter() - started


LOAD_PROBE = """
import json, sys, time, torch
from fleetrl.agents.pi0.checkpoint import load_pi0
from transformers.models.gemma import modeling_gemma
from transformers.models.siglip import modeling_siglip
device = sys.argv[2]
if device == "cuda":
    torch.zeros(1, device=device)
def high_water_mark():  # this process's peak resident memory (ru_maxrss would carry the parent's over exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
baseline = high_water_mark()  # Python, torch, transformers, CUDA
started = time.perf_counter()
model = load_pi0(sys.argv[1], dtype="bfloat16", device=device)
if device == "cuda":
    torch.cuda.synchronize()
seconds = time.perf_counter() - started
params = sum(p.numel() for p in model.parameters())
print(json.dumps({"seconds": seconds, "baseline_bytes": baseline,
                  "host_peak_bytes": high_water_mark(),
                  "gpu_peak_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else 0,
                  "parameters": params}))
"""


def measure_load(folder: str, device: str) -> dict:
    result = subprocess.run([sys.executable, "-c", LOAD_PROBE, folder, device], capture_output=True, text=True,
                            env={**os.environ})
    if result.returncode:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def observations(batch: int, device: str, tokens: int = 40) -> dict[str, torch.Tensor]:
    """LIBERO-shaped: two 224 px cameras, an 8-dim state, an instruction of bytes."""
    generator = torch.Generator().manual_seed(0)
    text = b"put the black bowl on the plate and the cream cheese in the basket"[:tokens]
    language = torch.zeros(batch, 128, dtype=torch.uint8)
    language[:, :len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    return {"main_image": torch.randint(0, 255, (batch, 224, 224, 3), dtype=torch.uint8, generator=generator),
            "wrist_image": torch.randint(0, 255, (batch, 224, 224, 3), dtype=torch.uint8, generator=generator),
            "state": torch.randn(batch, 8, generator=generator), "language": language}


def bench_tokenizer():
    """A byte-level tokenizer standing in for PaliGemma's (nothing downloads); ids stay in range."""
    from fleetrl.agents.hf.pretrained_base import import_transformers
    from fleetrl.agents.hf.tiny_builds import byte_level_bpe

    transformers = import_transformers("the bench")
    bpe = byte_level_bpe(["put the black bowl on the plate"], 300, ("<pad>", "<bos>", "<eos>"), "the bench")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<bos>",
                                                eos_token="<eos>")


def make_agent(folder: str, device: str, lora_rank: int):
    from fleetrl.agents.pi0.agent_config import FlowVLAAgentConfig
    from fleetrl.agents.pi0.checkpoint import load_pi0
    from fleetrl.agents.pi0.flow_vla_agent import BaseModel, FlowVLAAgent

    model = load_pi0(folder, dtype="bfloat16", device=device)
    config = FlowVLAAgentConfig(model_path=folder, chunk_size=5, denoise_steps=FLAGS.denoise_steps, dtype="bfloat16",
                                lora_rank=lora_rank)
    agent = FlowVLAAgent(config, 7, ("main_image", "wrist_image"),
                         base=BaseModel(model, bench_tokenizer(), None)).to(device)
    return agent


def ppo_samples_per_s(agent, device: str) -> float:
    """One PPO-shaped update: the recorded chains' log-prob under the current weights, the
    clipped ratio against their behaviour log-prob, the value loss, backward and Adam."""
    batch = FLAGS.update_batch
    obs = observations(batch, device)
    obs = {k: v.to(device) for k, v in obs.items()}
    agent.train()
    with torch.no_grad():
        acted, _ = agent.step(obs, torch.ones(batch, dtype=torch.bool, device=device), ())
    optimizer = torch.optim.Adam([p for p in agent.parameters() if p.requires_grad], lr=1e-6)
    unroll_obs = {k: v.unsqueeze(0) for k, v in obs.items()}
    recorded = {"chain": acted["chain"].unsqueeze(0), "stochastic": acted["stochastic"].unsqueeze(0)}
    behaviour = acted["log_prob"].sum((-1, -2))

    def update():
        out, _ = agent.unroll(unroll_obs, torch.zeros(1, batch, dtype=torch.bool, device=device), (), recorded)
        ratio = torch.exp(out["chain_log_prob"][0].sum((-1, -2)) - behaviour)
        advantage = torch.ones_like(ratio)
        loss = -torch.minimum(ratio * advantage, ratio.clamp(0.8, 1.2) * advantage).mean()
        loss = loss + out["baseline"].square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return batch / seconds_per_call(update, FLAGS.repeats)


def report_update(table, what: str, agent, device: str) -> None:
    try:
        table.add(f"PPO update, {what}", f"{ppo_samples_per_s(agent, device):.1f} samples/s",
                  f"batch {FLAGS.update_batch}")
    except torch.cuda.OutOfMemoryError:
        table.add(f"PPO update, {what}", "out of GPU memory", f"batch {FLAGS.update_batch}")


def matmul_tflops(device: str) -> tuple[float, str]:
    """The chip's measured dense matrix throughput (TFLOP/s) and the dtype it was taken in."""
    dtype, n = (torch.bfloat16, 8192) if device == "cuda" else (torch.float32, 1024)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    seconds = seconds_per_call(lambda: a @ b, 20)
    return 2 * n**3 / seconds / 1e12, str(dtype).removeprefix("torch.")


def flops_per_chunk(agent, device: str) -> float:
    """Floating-point operations of one chunk (batch 1, all denoise steps), as torch counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    obs = {k: v.to(device) for k, v in observations(1, device).items()}
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        agent.step(obs, torch.ones(1, dtype=torch.bool, device=device), ())
    return float(counter.get_total_flops())


class Table:
    """The figures as they come (printed at once) and as one markdown table at the end."""

    def __init__(self):
        self.rows: list[tuple[str, str, str]] = []

    def add(self, figure: str, value: str, note: str = "") -> None:
        print(f"{figure}: {value}{f' ({note})' if note else ''}", flush=True)
        self.rows.append((figure, value, note))

    def print(self) -> None:
        print("\n| figure | value | of the chip / against |\n|---|---|---|")
        for row in self.rows:
            print("| " + " | ".join(row) + " |")


def main(argv) -> None:
    del argv
    from fleetrl.bench.pi0_fleet import FleetSettings, measure_fleet

    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder, table = FLAGS.folder, Table()
    chip = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"device {device} ({chip}), torch {torch.__version__}, size {FLAGS.size}", flush=True)
    tflops, dtype = matmul_tflops(device)
    table.add(f"chip: dense {dtype} matmul", f"{tflops:.0f} TFLOP/s" if tflops >= 10 else f"{tflops:.2f} TFLOP/s",
              chip)
    path = os.path.join(folder, "model.safetensors")
    if not os.path.isfile(path):
        seconds = write_checkpoint(folder, FLAGS.size, device)
        print(f"wrote a random {FLAGS.size} pi0.5 in openpi's layout in {seconds:.1f} s")
    tokenizer_folder = os.path.join(folder, "bench_tokenizer")
    bench_tokenizer().save_pretrained(tokenizer_folder)
    file_bytes = os.path.getsize(path)
    for target in ("cpu", device) if device == "cuda" else ("cpu",):
        load = measure_load(folder, target)
        added = load["host_peak_bytes"] - load["baseline_bytes"]
        table.add(f"load_pi0 bfloat16 to {target}", f"{load['seconds']:.2f} s",
                  f"{load['parameters'] / 1e6:,.1f} M parameters, {file_bytes / 2**30:.2f} GiB file, host peak "
                  f"+{added / 2**30:.2f} GiB ({added / file_bytes:.2f}x the file), GPU peak "
                  f"{load['gpu_peak_bytes'] / 2**30:.2f} GiB")
    agent = make_agent(folder, device, 0).eval()
    flops = flops_per_chunk(agent, device)
    print(f"one chunk: {flops / 1e9:.1f} GFLOP ({FLAGS.denoise_steps} denoise steps, as FlopCounterMode counts)")
    alone: dict[int, float] = {}
    for size in map(int, FLAGS.batch_sizes):
        obs = {k: v.to(device) for k, v in observations(size, device).items()}
        first = torch.ones(size, dtype=torch.bool, device=device)

        def act(agent=agent, obs=obs, first=first):
            with torch.no_grad():
                agent.step(obs, first, ())

        seconds = seconds_per_call(act, FLAGS.repeats)
        alone[size] = size / seconds
        table.add(f"model alone, batch {size}", f"{alone[size]:.1f} chunks/s ({1000 * seconds:.1f} ms a batch)",
                  f"{alone[size] * flops / 1e12 / tflops:.0%} of the chip")
    if device == "cuda":
        print(f"peak GPU memory so far {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    report_update(table, "expert only", agent, device)
    del agent
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    agent = make_agent(folder, device, FLAGS.lora_rank)
    report_update(table, f"expert + LoRA rank {FLAGS.lora_rank} on the prefix", agent, device)
    if device == "cuda":
        print(f"peak GPU memory in the LoRA update {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    del agent
    if device == "cuda":
        torch.cuda.empty_cache()
    if FLAGS.fleet_actors:
        settings = FleetSettings(actors=FLAGS.fleet_actors, envs_per_actor=FLAGS.fleet_envs_per_actor,
                                 inference_batch_size=FLAGS.fleet_inference_batch, warmup_s=FLAGS.fleet_warmup_s,
                                 measure_s=FLAGS.fleet_measure_s,
                                 block_inference_on_training=FLAGS.fleet_block_inference_on_training)
        fleet = measure_fleet(folder, tokenizer_folder, device, os.path.join(folder, "fleet_run"), settings,
                              FLAGS.denoise_steps)
        nearest = min(alone, key=lambda b: abs(b - fleet.mean_batch))
        table.add(f"whole system, {settings.actors} actors x {settings.envs_per_actor} envs, PPO on",
                  f"{fleet.chunks_per_s:.1f} chunks/s",
                  f"{fleet.chunks_per_s / alone[nearest]:.2f}x the model alone at batch {nearest}; "
                  f"{fleet.chunks_per_s * flops / 1e12 / tflops:.0%} of the chip")
        table.add("whole system: inference batch", f"{fleet.mean_batch:.1f} envs",
                  f"{fleet.batch_fill:.0%} of {settings.inference_batch_size}")
        table.add("whole system: PPO while serving", f"{fleet.ppo_samples_per_s:.1f} samples/s",
                  f"{fleet.trainer_steps_per_s:.2f} trainer steps/s of {settings.unroll_length} x "
                  f"{settings.batch_size} chunks")
        table.add("whole system: GPU busy", "n/a (no nvidia-smi)" if fleet.gpu_busy is None
                  else f"{fleet.gpu_busy:.0%}", f"{fleet.writes} summary writes averaged")
    table.print()


if __name__ == "__main__":
    define_flags()
    app.run(main)
