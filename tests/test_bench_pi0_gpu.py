"""`make bench-gpu`'s script at --size=tiny: every step of the GPU bench on a CPU, the whole
system included (a learner process serving the flow VLA to actor processes over gRPC,
PPO on), ending in one table of real figures."""

import re
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="the vlm extra (make install puts it in)")


@pytest.mark.slow
def test_the_tiny_bench_runs_every_step_and_prints_one_table(tmp_path):
    command = [sys.executable, "-m", "fleetrl.bench.pi0_gpu", "--size=tiny", f"--folder={tmp_path / 'pi05'}",
               "--batch_sizes=1,4", "--repeats=1", "--update_batch=4", "--lora_rank=4", "--fleet_actors=2",
               "--fleet_envs_per_actor=2", "--fleet_inference_batch=4", "--fleet_warmup_s=20", "--fleet_measure_s=12"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = done.stdout[done.stdout.index("| figure |"):]
    cells = [line.strip("| ").split(" | ") for line in table.splitlines()[2:]]
    rows, notes = {c[0]: c[1] for c in cells}, {c[0]: c[2] for c in cells}

    def number(name: str) -> float:
        value = next(v for k, v in rows.items() if k.startswith(name))
        return float(re.match(r"[\d.]+", value).group())

    assert number("chip: dense float32 matmul") > 0
    assert rows["load_pi0 bfloat16 to cpu"].endswith(" s")
    assert float(notes["load_pi0 bfloat16 to cpu"].split(" M parameters")[0]) > 0.1  # the tiny pi0.5 loaded
    assert number("model alone, batch 1") > 0 and number("model alone, batch 4") > 0
    assert number("PPO update, expert only") > 0 and number("PPO update, expert + LoRA") > 0
    assert number("whole system, 2 actors x 2 envs") > 0  # chunks/s served end to end
    assert 0 < number("whole system: inference batch") <= 4
    assert number("whole system: PPO while serving") > 0  # the trainer stepped while serving
    assert rows["whole system: GPU busy"].startswith("n/a")  # no nvidia-smi on a CPU machine
