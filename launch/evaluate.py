"""Evaluates a checkpoint without a training run:

    python -m fleetrl.launch.evaluate --checkpoint=runs/x/checkpoints/best.pt --episodes=100 [--record]
    python -m fleetrl.launch.evaluate --problem=libero_flow_vla --hparams=model_path=/ckpt/pi05_libero,...

Plays episodes 0 .. N-1 of the Problem's eval set (the same resets eval actors play) with
the learner's own eval inference (`EvalInference`: deterministic actions, recurrent state
per env), prints a table of the episode metrics and writes them as JSON. With --record it
saves the first --record_episodes episodes as GIF or MP4 files and as TensorBoard
animations (see `episode_recorder`). The Problem and its hparams come from the checkpoint
unless given.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import torch
from absl import logging
from torch.utils.tensorboard import SummaryWriter

from fleetrl.actor.eval_episodes import EvalEpisodes
from fleetrl.common.extras import MissingExtra
from fleetrl.common.files import atomic_write_json
from fleetrl.launch.configs import EvaluateConfig
from fleetrl.launch.episode_recorder import EpisodeRecorder
from fleetrl.launch.flags import define_flags, from_flags, run_main
from fleetrl.launch.progress import EpisodeProgress
from fleetrl.learner.evaluation.eval_inference import EvalInference, EvalRequest
from fleetrl.learner.inference.env_state_store import build_state_store
from fleetrl.learner.inference.inference_step import StepRequest
from fleetrl.learner.run.saved_policy import load_policy, pretrained_policy
from fleetrl.problems.eval_records import eval_records
from fleetrl.problems.hparams import parse_hparams
from fleetrl.proto.run_ids import new_run_ids

define_flags(EvaluateConfig)


def evaluate(problem, agent: torch.nn.Module, episodes: int, num_envs: int, device: torch.device,
             recorder: EpisodeRecorder | None = None, records: list[dict] | None = None,
             on_finished: Callable[[dict[int, dict[str, float]]], None] | None = None) -> list[dict[str, float]]:
    """Each episode's metrics, in episode order; the Problem's episode records go to
    `records`; `on_finished` sees the metrics of every episode finished so far, by episode,
    after each step that finished one."""
    store = build_state_store(problem, agent, 0, device, record=False)
    inference = EvalInference(problem, store, device)
    num_envs = min(num_envs, episodes)
    slots = store.allocate(num_envs)
    run_ids = new_run_ids(num_envs)
    envs = EvalEpisodes(problem, num_envs, recorder.on_frame if recorder else None)
    results: dict[int, dict[str, float]] = {}
    kept: dict[int, dict] = {}
    try:
        envs.start(range(episodes))
        while envs.playing:
            pending = envs.pending()
            results.update((f.episode, f.metrics) for f in pending.finished)
            if pending.finished and on_finished is not None:
                on_finished(results)
            kept.update((f.episode, f.record) for f in pending.finished if f.record is not None)
            i = pending.env_indices
            request = StepRequest(slots=slots[i], run_ids=run_ids[i], observation=pending.observation,
                                  extras=pending.extras, reward=pending.reward, terminated=pending.terminated,
                                  truncated=pending.truncated)
            envs.advance(pending, inference([EvalRequest(request, agent)])[0])
    finally:
        envs.close()
    if records is not None:
        records.extend(kept[e] for e in sorted(kept))
    return [results[e] for e in range(episodes)]


def _check_recordable(problem) -> None:
    """Fails now, not after the first episode, when --record has nothing to draw."""
    env = problem.make_eval_env()
    try:
        obs, _ = env.reset(seed=problem.eval_reset(0)[0])
        observation = obs if isinstance(obs, dict) else {"observation": obs}
        if problem.render_frame({k: np.asarray(v) for k, v in observation.items()}, env) is None:
            raise ValueError(f"--record: {type(problem).__name__} has nothing to record: its observations hold no "
                             "image and its env does not render rgb_array; make the env with "
                             "render_mode='rgb_array' or override Problem.render_frame")
    finally:
        env.close()


def main(argv: list[str]) -> int:
    del argv
    # Headless: pygame draws rendering envs (CartPole's) off screen, without a display or sound.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    try:
        config = from_flags(EvaluateConfig)
        hparams = parse_hparams(config.hparams or "")
        policy = (load_policy(config.checkpoint, hparams, config.problem, config.device,
                              any_problem=config.allow_other_problem) if config.checkpoint
                  else pretrained_policy(config.problem, hparams, config.device))
        path, checkpoint, problem, agent = policy.path, policy.checkpoint, policy.problem, policy.agent
        name = config.problem or checkpoint["problem"]
        if name != checkpoint["problem"]:
            logging.info("playing %s's weights with problem %s", checkpoint["problem"], name)
        if config.record:
            _check_recordable(problem)
    except (ValueError, MissingExtra) as e:  # a bad flag, an unknown Problem, a checkpoint that does not fit
        logging.error("%s", e)
        return 2
    print(f"evaluating {policy.source()}")
    episodes = config.episodes or problem.num_eval_episodes()
    output = config.output or (os.path.splitext(path)[0] + "-eval" if path else os.path.join("runs", f"{name}-eval"))
    recorder = (EpisodeRecorder(problem, output, config.record_episodes, config.record_fps, config.record_format)
                if config.record else None)
    with torch.no_grad():
        records: list[dict] = []
        per_episode = evaluate(problem, agent, episodes, config.num_envs, torch.device(config.device), recorder,
                               records, EpisodeProgress(episodes))

    names = sorted({k for metrics in per_episode for k in metrics})
    table = {n: [m[n] for m in per_episode if n in m] for n in names}
    print(f"{name} at policy version {checkpoint['policy_version']:,}, {episodes} episodes")
    print(f"{'metric':<16} {'mean':>10} {'std':>10} {'min':>10} {'max':>10}")
    for n, values in table.items():
        stats = (np.mean(values), np.std(values), np.min(values), np.max(values))
        print(f"{n:<16} " + " ".join(f"{v:>10.3f}" for v in stats))
    os.makedirs(output, exist_ok=True)
    report = {"problem": name, "hparams": policy.hparams, "checkpoint": os.path.abspath(path) if path else None,
              "policy_version": checkpoint["policy_version"], "episodes": episodes,
              "metrics": {n: float(np.mean(v)) for n, v in table.items()}, "per_episode": per_episode}
    atomic_write_json(os.path.join(output, "metrics.json"), report, indent=2)  # a NaN mean is null
    for path in eval_records(problem).write_eval_records(records, output):
        print(f"wrote {path}")
    if recorder is not None:
        with SummaryWriter(output) as writer:
            for n, mean in report["metrics"].items():
                writer.add_scalar(f"eval/{n}", mean, checkpoint["policy_version"])
            recorder.write_tensorboard(writer, checkpoint["policy_version"])
        print(f"recorded {len(recorder.saved)} episodes in {output}")
    print(f"metrics: {os.path.join(output, 'metrics.json')}")
    return 0


def run() -> None:
    run_main(main, __doc__)


if __name__ == "__main__":
    run()
