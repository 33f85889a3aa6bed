"""The r2r Problem through the whole system: synthetic data generated on first use, V-trace
mixed with teacher forcing, per-split eval metrics, and R2R results files."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fleetrl.problems import load_problem

SPLITS = ("val_seen", "val_unseen")
METRICS = ("PL", "NE", "SR", "OSR", "SPL", "CLS", "nDTW", "SDTW")


def test_the_eval_set_is_every_instruction_of_both_splits_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    problem = load_problem("r2r")
    env = problem.make_env()  # generates data/r2r_synthetic here
    assert (tmp_path / "data" / "r2r_synthetic" / "R2R_val_unseen.json").exists()
    sizes = {split: len(env.episodes[split]) for split in SPLITS}
    assert problem.num_eval_episodes() == sum(sizes.values())
    seen = {split: set() for split in SPLITS}
    for episode in range(problem.num_eval_episodes()):
        _, options = problem.eval_reset(episode)
        seen[options["split"]].add(options["index"])
    assert seen == {split: set(range(sizes[split])) for split in SPLITS}
    obs = env.reset(options={"split": "val_unseen", "index": 0})[0]
    done = False
    while not done:
        obs, _, terminated, truncated, info = env.step(obs["oracle_action"])
        done = terminated or truncated
    metrics = problem.episode_metrics(info)
    assert set(metrics) == {f"val_unseen/{m}" for m in METRICS} and metrics["val_unseen/SR"] == 1.0
    env.reset(options={"split": "train", "index": 0})
    while True:
        obs, _, terminated, truncated, info = env.step(0)
        if terminated or truncated:
            break
    assert set(problem.episode_metrics(info)) == set(METRICS)  # training episodes: train/SR, ...


@pytest.mark.slow
def test_r2r_learns_to_follow_instructions_in_unseen_houses(tmp_path, monkeypatch, local_run):
    """The default demo, shortened. A random policy stops at the goal about 3% of the time."""

    monkeypatch.chdir(tmp_path)  # where data/r2r_synthetic gets generated

    # The run stops at the first eval round of SR 0.25 on the unseen houses, or at 200k env steps.
    process, tag = local_run.start(tmp_path / "run", "--problem=r2r", "--seed=0", "--total_env_steps=200000",
                                   "--num_eval_actors=1", "--eval_envs_per_actor=16", "--eval_interval_s=20",
                                   "--best_metric=val_unseen/SR", "--target_eval_metric=0.25", cwd=tmp_path)
    code, output = local_run.finish(process, tag)
    assert code == 0, output
    rounds = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert rounds and all(f"{split}/{m}" in rounds[-1] for split in SPLITS for m in METRICS)
    events = EventAccumulator(str(tmp_path / "run" / "eval"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    assert {f"eval/{split}/{m}" for split in SPLITS for m in METRICS} <= set(events.Tags()["scalars"])
    # A top-down picture of each split's first episode, per round.
    assert {f"eval/{split}/topdown" for split in SPLITS} <= set(events.Tags()["images"])
    steps = [e.step for e in events.Images("eval/val_unseen/topdown")]
    assert steps == [e.step for e in events.Scalars("eval/val_unseen/SR")]
    best = max(r["val_unseen/SR"] for r in rounds)
    assert best >= 0.25, rounds[-1]

    # Standalone evaluation writes R2R results files and top-down pictures.
    checkpoint = tmp_path / "run" / "checkpoints" / "best.pt"
    result = subprocess.run([sys.executable, "-m", "fleetrl.launch.evaluate", f"--checkpoint={checkpoint}",
                             f"--output={tmp_path / 'eval'}", "--num_envs=16"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert report["episodes"] == load_problem("r2r").num_eval_episodes()
    assert report["metrics"]["val_unseen/SR"] == pytest.approx(
        torch.load(checkpoint, weights_only=True)["eval_metrics"]["val_unseen/SR"])  # same greedy policy
    for split in SPLITS:
        results = json.loads((tmp_path / "eval" / f"results_{split}.json").read_text())
        assert all(set(r) == {"instr_id", "trajectory"} and len(r["trajectory"][0]) == 3 for r in results)
        (picture,) = (tmp_path / "eval").glob(f"topdown_{split}_*.png")
        pixels = np.asarray(Image.open(picture))
        assert pixels.shape == (256, 256, 3) and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 3



def test_eval_pictures_that_are_not_rgb_images_are_refused():
    from fleetrl.learner.transport.wire_messages import decode_images
    from fleetrl.proto import learner_pb2 as pb
    from fleetrl.proto.tensors import WireError, encode

    picture = encode("val_seen/topdown", np.zeros((4, 5, 3), np.uint8))
    good = pb.EpisodeStats(env_index=0, eval_episode=3, images=[picture])
    assert decode_images(good)["val_seen/topdown"].shape == (4, 5, 3)
    for image, why in ((np.zeros((4, 5), np.uint8), "expected \\[H, W, 3\\] uint8"),
                       (np.zeros((4, 5, 3), np.float32), "got float32"),
                       (np.zeros((3000, 2, 3), np.uint8), "at most 2048")):
        with pytest.raises(WireError, match=why):
            decode_images(pb.EpisodeStats(env_index=0, eval_episode=3, images=[encode("x", image)]))
    with pytest.raises(WireError, match="only with eval episodes"):
        decode_images(pb.EpisodeStats(env_index=0, images=[encode("x", np.zeros((4, 5, 3), np.uint8))]))
