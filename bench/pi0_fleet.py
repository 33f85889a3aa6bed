"""The whole system on one machine: the learner serving a flow VLA to actor processes over
gRPC while PPO trains, measured from the learner's own TensorBoard scalars.

`measure_fleet` starts `fleetrl.launch.local` with `bench.libero_shaped`'s Problem (a
LIBERO-shaped env almost free to step) on the given checkpoint, lets it warm up, and
averages the scalars written in the measured window: env steps/s (one env step is one
chunk), the mean inference batch (its fill against `inference_batch_size`) and trainer
steps/s, which make PPO's samples/s (T x B chunks a step). A thread samples the GPU's
busy fraction from `nvidia-smi` meanwhile. The run ends by SIGTERM, as Ctrl-C ends one.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

PROBLEM = "fleetrl.bench.libero_shaped:LiberoShapedProblem"


@dataclasses.dataclass(frozen=True)
class FleetSettings:
    actors: int = 12
    envs_per_actor: int = 8
    inference_batch_size: int = 64
    unroll_length: int = 8
    batch_size: int = 16
    warmup_s: float = 60.0
    measure_s: float = 60.0
    block_inference_on_training: bool = False
    extra_flags: tuple[str, ...] = ()


@dataclasses.dataclass
class FleetFigures:
    chunks_per_s: float
    mean_batch: float
    batch_fill: float
    trainer_steps_per_s: float
    ppo_samples_per_s: float
    gpu_busy: float | None  # None where nvidia-smi is not at hand
    writes: int  # summary writes averaged


class GpuBusy:
    """nvidia-smi's utilization.gpu, sampled every `interval_ms` while running."""

    def __init__(self, interval_ms: int = 500):
        self.samples: list[float] = []
        try:
            self._process = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", f"-lms={interval_ms}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self._process = None
            return
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.recording = False

    def _read(self) -> None:
        for line in self._process.stdout:
            if self.recording and line.strip().split(",")[0].strip().isdigit():
                self.samples.append(float(line.split(",")[0]) / 100)

    def stop(self) -> float | None:
        if self._process is None:
            return None
        self._process.terminate()
        self._process.wait()
        return statistics.mean(self.samples) if self.samples else None


def scalars(logdir: str) -> dict[str, list[tuple[float, float]]]:
    """Every scalar the learner wrote: tag -> [(wall time, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(logdir, size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.wall_time, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def measure_fleet(model_path: str, tokenizer_path: str, device: str, logdir: str, settings: FleetSettings,
                  denoise_steps: int = 5, chunk_size: int = 5) -> FleetFigures:
    s = settings
    command = [sys.executable, "-m", "fleetrl.launch.local", f"--problem={PROBLEM}", f"--logdir={logdir}",
               f"--model_path={model_path}", f"--tokenizer_path={tokenizer_path}", f"--device={device}",
               f"--dtype={'bfloat16' if device.startswith('cuda') else 'float32'}",
               f"--num_actors={s.actors}", f"--envs_per_actor={s.envs_per_actor}", "--num_eval_actors=0",
               f"--inference_batch_size={s.inference_batch_size}", f"--unroll_length={s.unroll_length}",
               f"--batch_size={s.batch_size}", f"--block_inference_on_training={s.block_inference_on_training}",
               f"--denoise_steps={denoise_steps}", f"--chunk_size={chunk_size}", "--summary_interval_s=5",
               "--checkpoint_interval_s=0", "--eval_interval_s=0", "--seed=0",
               *s.extra_flags]
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, "bench_launch.log"), "w") as log:
        launch = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        busy = GpuBusy()
        try:
            _wait(launch, s.warmup_s, logdir)
            window_start = time.time()
            busy.recording = True
            _wait(launch, s.measure_s, logdir)
            window_end = time.time()
        finally:
            gpu = busy.stop()
            if launch.poll() is None:
                launch.send_signal(signal.SIGTERM)
                try:
                    launch.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    os.killpg(launch.pid, signal.SIGKILL)
                    launch.wait()
    written = scalars(logdir)

    def window_mean(tag: str) -> tuple[float, int]:
        values = [v for t, v in written.get(tag, []) if window_start <= t <= window_end + 1]
        return (statistics.mean(values) if values else 0.0), len(values)

    chunks, writes = window_mean("throughput/env_steps_per_s")
    batch, _ = window_mean("inference/mean_batch_size")
    trainer, _ = window_mean("throughput/learner_steps_per_s")
    if writes == 0:
        raise RuntimeError(f"the learner wrote no throughput in the measured window; see {logdir}/bench_launch.log "
                           f"and {logdir}/logs/")
    return FleetFigures(chunks, batch, batch / s.inference_batch_size, trainer,
                        trainer * s.unroll_length * s.batch_size, gpu, writes)


def _wait(launch: subprocess.Popen, seconds: float, logdir: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if launch.poll() is not None:
            raise RuntimeError(f"the run ended early (exit {launch.returncode}); see {logdir}/bench_launch.log")
        time.sleep(0.5)
