"""The point_reach Problem's flow VLA through the learner's own inference and training:
the chain stays on the learner, an update trains what trains, a checkpoint holds that."""


import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="the vlm extra (make install puts it in)")

from fleetrl.learner.inference.env_state_store import build_state_store  # noqa: E402
from fleetrl.learner.inference.inference_step import InferenceStep, StepRequest
from fleetrl.learner.policy_version import PolicyVersion  # noqa: E402
from fleetrl.learner.training.trainer import Trainer  # noqa: E402
from fleetrl.losses.batch import UnrollBatch  # noqa: E402
from fleetrl.problems import load_problem  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def _model_cache(tiny_model_cache):
    """Tiny models are built into a folder of this module's own, not the user's cache."""


def point_reach(**hparams):
    settings = {"action_width": 8, "value_hidden": "[32]", **hparams}
    return load_problem("point_reach", {k: str(v) for k, v in settings.items()})


def real_unrolls(problem, agent, unroll_length=2, num_envs=4) -> tuple[UnrollBatch, list[dict]]:
    """Unrolls of real PointReach steps through the learner's inference step, and its replies."""
    store = build_state_store(problem, agent, unroll_length, CPU)
    unrolls, replies = [], []
    inference = InferenceStep(problem, agent, PolicyVersion(), store, lambda u: unrolls.append(u) or True, CPU)
    envs = [problem.make_actor_env() for _ in range(num_envs)]
    obs, infos = (list(x) for x in zip(*(env.reset(seed=i) for i, env in enumerate(envs))))
    slots, run_ids = store.allocate(num_envs), np.arange(1, num_envs + 1, dtype=np.uint64)
    reward, terminated = np.zeros(num_envs, np.float32), np.zeros(num_envs, bool)
    for _ in range(unroll_length + 1):
        # As an actor sends them: each extra from the step's info, zeros where it has none.
        extras = {s.name: np.stack([np.asarray(info.get(s.name, np.zeros(s.shape, s.dtype)), s.dtype)
                                    for info in infos]) for s in problem.extra_specs()}
        request = StepRequest(slots=slots, run_ids=run_ids,
                              observation={k: np.stack([o[k] for o in obs]) for k in obs[0]}, extras=extras,
                              reward=reward, terminated=terminated, truncated=np.zeros(num_envs, bool))
        replies.append(inference([request])[0])
        for i, env in enumerate(envs):
            obs[i], reward[i], terminated[i], truncated, infos[i] = env.step(replies[-1]["action"][i])
            if terminated[i] or truncated:
                obs[i], infos[i] = env.reset()
    return UnrollBatch.collate(unrolls), replies


def test_actors_get_the_chunk_and_the_learner_keeps_the_chain():
    problem = point_reach()
    torch.manual_seed(0)
    agent = problem.make_agent()
    batch, replies = real_unrolls(problem, agent)
    assert all(set(reply) == {"action"} and reply["action"].shape == (4, 4, 2) for reply in replies)
    # pi0's chain at RLinf's 4 denoise steps: [T+1, envs, K+1, H, the model's action width].
    assert batch.action["chain"].shape == (3, 4, 5, 4, 8) and batch.action["stochastic"].shape == (3, 4, 4)
    assert batch.behaviour_log_prob.shape == (3, 4, 4, 2)
    # Training recomputes the recorded log-probs from the recorded chains.
    with torch.no_grad():
        out, _ = agent.unroll(batch.observation, batch.first, batch.initial_state, batch.action)
    torch.testing.assert_close(problem.action_log_prob(out, batch.action), batch.behaviour_log_prob, atol=1e-4,
                               rtol=0)


PI0 = "pi0.paligemma_with_expert."


@pytest.mark.parametrize("hparams,trains,frozen", [
    ({"train_prefix": "false", "train_vision": "false"},
     (PI0 + "gemma_expert.", "pi0.action_in_proj.", "pi0.action_out_proj.", "pi0.action_time_mlp_in.",
      "pi0.state_proj.", "value_head."), PI0 + "paligemma."),
    ({"train_vision": "false"}, (PI0 + "paligemma.model.language_model.", PI0 + "gemma_expert."),
     PI0 + "paligemma.model.vision_tower."),
    ({}, (PI0 + "paligemma.model.language_model.", PI0 + "paligemma.model.vision_tower."), None),  # the defaults
])
def test_an_update_trains_only_what_trains_and_the_checkpoint_holds_it(hparams, trains, frozen):
    problem = point_reach(learning_rate=1e-2, **hparams)
    torch.manual_seed(0)
    agent = problem.make_agent()
    batch, _ = real_unrolls(problem, agent)
    before = {name: p.detach().clone() for name, p in agent.named_parameters()}
    Trainer(problem, agent, problem.make_optimizer(agent.parameters()), PolicyVersion(), CPU).update(batch)
    changed = {name for name, p in agent.named_parameters() if not torch.equal(before[name], p)}
    trainable = {name for name, p in agent.named_parameters() if p.requires_grad}
    assert changed and changed <= trainable, sorted(changed - trainable)
    for part in trains:
        assert any(name.startswith(part) for name in changed), (part, sorted(changed))
    if frozen:
        assert not any(name.startswith(frozen) for name in changed)
    saved = set(agent.state_dict())
    assert saved == {n for n in before if n in trainable or not n.startswith("pi0.")} | {"base_fingerprint"}
    agent.load_state_dict(agent.state_dict())
    # An eval round's snapshot (whose state_dict is best.pt) saves the same, though nothing trains in it.
    from fleetrl.learner.evaluation.eval_rounds import frozen_copy

    snapshot = frozen_copy(agent)
    assert set(snapshot.state_dict()) == saved
    agent.load_state_dict(snapshot.state_dict())


def test_a_mismatched_base_model_is_refused(tmp_path):
    from fleetrl.agents.pi0.tiny import TinyPi0Config, build_tiny_pi0

    problem = point_reach()
    agent = problem.make_agent()
    other = build_tiny_pi0(problem.corpus(), TinyPi0Config(vision_layers=2, action_dim=8), root=str(tmp_path))
    stranger = point_reach(model_path=other).make_agent()
    with pytest.raises(ValueError, match=r"trained on another base model .* than " + str(other)):
        stranger.load_state_dict(agent.state_dict())


def test_teacher_forced_steps_play_the_oracles_chunk_and_train_on_it():
    problem = point_reach(teacher_forcing_fraction=1, algorithm="supervised", learning_rate=3e-3)
    torch.manual_seed(0)
    agent = problem.make_agent()
    env = problem.make_actor_env()
    obs, info = env.reset(seed=0)
    assert info["teacher_forcing"] and obs["oracle_action"].shape == (4, 2)
    batch, replies = real_unrolls(problem, agent)
    oracle = batch.observation["oracle_action"]
    torch.testing.assert_close(torch.from_numpy(np.stack([r["action"] for r in replies])), oracle)
    trainer = Trainer(problem, agent, problem.make_optimizer(agent.parameters()), PolicyVersion(), CPU)
    losses = [float(trainer.update(batch)["loss/teacher_forcing"]) for _ in range(30)]
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses


@pytest.mark.parametrize("hparams", [{"lora_rank": 4, "lora_expert": "true", "train_prefix": "false"}, {}])
def test_export_writes_openpis_layout_that_plays_the_same_chunks(tmp_path, python, hparams):
    """launch.export --pretrained_dir on a checkpoint: an openpi-layout folder (LoRA merged,
    openpi's keys) that load_pi0 reads as any checkpoint, and load_exported plays the same
    chunks and values for the same noise."""
    import os
    import subprocess

    from safetensors import safe_open

    from fleetrl.agents.pi0.flow_vla_agent import load_exported
    from fleetrl.learner.run.checkpoint import CHECKPOINT_FORMAT, atomic_save

    problem = point_reach(**hparams)
    torch.manual_seed(0)
    agent = problem.make_agent()
    with torch.no_grad():  # as if trained: adapters that change the prefix's and the expert's outputs
        for parameter in agent.parameters():
            if parameter.requires_grad:
                parameter.add_(0.05 * torch.randn_like(parameter))
    checkpoint = tmp_path / "ckpt-1.pt"
    atomic_save({"format": CHECKPOINT_FORMAT, "problem": problem.name,
                 "hparams": {k: str(v) for k, v in {"action_width": 8, "value_hidden": "[32]", **hparams}.items()},
                 "policy_version": 1, "model": agent.state_dict()}, str(checkpoint))
    exported = tmp_path / "policy"
    result = subprocess.run([python, "-m", "fleetrl.launch.export", f"--checkpoint={checkpoint}",
                             f"--output={tmp_path / 'model.pt'}", f"--pretrained_dir={exported}"],
                            capture_output=True, text=True, env={**os.environ})
    assert result.returncode == 0, result.stderr
    with safe_open(exported / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    assert "paligemma_with_expert.paligemma.lm_head.weight" in names and not any("lora" in n for n in names)
    loaded = load_exported(str(exported))
    assert not any("lora" in name for name in loaded.state_dict())
    agent.eval()
    env = problem.make_env()
    obs = [env.reset(seed=s)[0] for s in range(3)]
    batch = {k: torch.from_numpy(np.stack([o[k] for o in obs])) for k in obs[0]}
    noise = torch.randn(3, 4, 8)
    with torch.no_grad():
        ours, our_value = agent.sample_chunks(batch, noise=noise)
        theirs, their_value = loaded.sample_chunks(batch, noise=noise)
    torch.testing.assert_close(theirs.actions, ours.actions, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(their_value, our_value, atol=1e-5, rtol=1e-5)

    # An export written before the agent took one config listed its keyword arguments.
    import json

    path = exported / "fleetrl_agent.json"
    settings = json.loads(path.read_text())["config"]
    path.write_text(json.dumps({
        "action_dim": loaded.action_dim, "chunk_size": settings["chunk_size"], "image_keys": ["image"],
        "state_key": "state", "language_key": "language", "oracle_key": settings["oracle_key"],
        "sampler": {k: settings[k] for k in ("denoise_steps", "noise_method", "noise_level", "stochastic_steps",
                                             "log_prob_reduction")},
        "noise_std_range": [settings["noise_std_min"], settings["noise_std_max"]],
        "value_input": settings["value_input"] or loaded.value_input, "value_pooling": settings["value_pooling"],
        "value_hidden": settings["value_hidden"], "delta_action_dims": settings["delta_action_dims"]}))
    with torch.no_grad():
        older, older_value = load_exported(str(exported)).sample_chunks(batch, noise=noise)
    torch.testing.assert_close(older.actions, ours.actions, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(older_value, our_value, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_grpo_trains_the_flow_vla_through_the_whole_system(tmp_path, local_run):
    """GRPO over chunks: groups of 4 envs share each reset, the learner normalizes their
    episode returns, and PPO's clipped loss trains on the recorded chains' log-probs."""
    import json

    logdir = tmp_path / "run"
    process, tag = local_run.start(
        logdir, "--problem=point_reach", "--algorithm=grpo", "--group_size=4", "--num_actors=1",
        "--envs_per_actor=8", "--unroll_length=4", "--batch_size=4", "--total_env_steps=600",
        "--hparams=action_width=8,value_hidden=[32]", "--seed=0")
    code, output = local_run.finish(process, tag)
    assert code == 0, output
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["trainer_steps"] >= 2 and summary["episodes"] >= 8, summary
    scalars = local_run.read_scalars(logdir)
    assert "loss/policy" in scalars and "loss/baseline" not in scalars, sorted(scalars)
    assert all(np.isfinite(v) for v in scalars["loss/policy"])
