"""libero_flow_vla through the whole system with the tiny pi0 (saved in openpi's layout and
loaded as a real checkpoint is): a warm start on a demonstration file in LIBERO's layout
(written here), then PPO on the real simulator; and the agent's reading of LIBERO."""

import json

import pytest
import torch

pytest.importorskip("transformers", reason="the vlm extra (make install puts it in)")
pytest.importorskip("libero", reason="make libero installs it")

pytestmark = [pytest.mark.slow, pytest.mark.libero]  # launch.local runs, and the real simulator


def test_a_warm_start_on_demonstrations_then_ppo_on_the_simulator(tmp_path, local_run, monkeypatch, write_demo_file):
    from fleetrl.envs.libero.env import LiberoEnv

    monkeypatch.setenv("FLEETRL_CACHE", str(tmp_path / "models"))
    # Demonstrations of the task the simulator then plays: one tiny model (its tokenizer
    # learns the instructions) serves both runs, so the warm start's weights load.
    instruction = LiberoEnv("libero_spatial", (0,)).suite.get_task(0).language
    demos = write_demo_file(tmp_path / "demo.hdf5", instruction=instruction, lengths=(12, 10, 11), size=32)
    common = ("--problem=libero_flow_vla", "--suite=libero_spatial", "--task_ids=[0]", "--image_size=32",
              "--chunk_size=4", "--action_width=8", "--value_hidden=[32]", "--num_actors=1", "--seed=0")
    warm = tmp_path / "warm"
    process, tag = local_run.start(warm, *common, f"--demo_files={demos}", "--algorithm=supervised",
                                   "--teacher_forcing_fraction=1", "--envs_per_actor=2", "--unroll_length=2",
                                   "--batch_size=2", "--minibatches=1", "--total_env_steps=40")
    code, output = local_run.finish(process, tag)
    assert code == 0, output
    scalars = local_run.read_scalars(warm)
    assert "loss/teacher_forcing" in scalars and scalars["teacher_forcing/fraction"][-1] == 1.0, sorted(scalars)
    saved = torch.load(max((warm / "checkpoints").glob("ckpt-*.pt")), weights_only=True)
    assert "base_fingerprint" in saved["model"] and any(k.startswith("pi0.paligemma_with_expert.gemma_expert.")
                                                          for k in saved["model"])
    assert not any(k.startswith("pi0.paligemma_with_expert.paligemma.") for k in saved["model"])  # frozen

    rl = tmp_path / "rl"
    process, tag = local_run.start(rl, *common, f"--init_checkpoint={warm}", "--envs_per_actor=1",
                                   "--max_episode_steps=8", "--num_wait_steps=1", "--unroll_length=2",
                                   "--batch_size=1", "--minibatches=1", "--total_env_steps=6")
    code, output = local_run.finish(process, tag)
    assert code == 0, output
    summary = json.loads((rl / "summary.json").read_text())
    assert summary["trainer_steps"] >= 1 and summary["episodes"] >= 1, summary
    scalars = local_run.read_scalars(rl)
    assert {"loss/policy", "ppo/approx_kl", "episode/success_once"} <= set(scalars), sorted(scalars)
    assert set(scalars["episode/episode_len"]) == {8.0}  # 2 chunks of 4 actions, then truncation


def test_the_agent_reads_libero_as_openpis_client_does(tmp_path):
    """openpi's LIBERO client, computed here from robosuite's raw observation: both cameras
    rotated 180 degrees and resized with pad (uint8) to the model's size, the state from the
    end-effector's position, its quaternion as robosuite's axis-angle and the gripper's
    joints, the task's language as the prompt; the agent's model inputs must be those."""
    import numpy as np
    from robosuite.utils.transform_utils import quat2axisangle

    from fleetrl.agents.pi0.agent_config import FlowVLAAgentConfig
    from fleetrl.agents.pi0.flow_vla_agent import FlowVLAAgent
    from fleetrl.agents.pi0.model import resize_with_pad
    from fleetrl.agents.pi0.prompt import tokenize_prompts
    from fleetrl.agents.pi0.tiny import TinyPi0Config, build_tiny_pi0
    from fleetrl.envs.libero.env import LiberoEnv

    env = LiberoEnv("libero_spatial", (0, 1), image_size=256)
    try:
        env.reset(seed=0, options={"task_index": 1, "trial": 3})  # builds the task's simulator
        raws, step = [], env._sim.step
        env._sim.step = lambda action: raws.append(step(action)) or raws[-1]  # robosuite's own observations
        obs, _ = env.reset(seed=0, options={"task_index": 1, "trial": 3})
        raw = raws[-1][0]  # after the last wait step
        language = env.suite.get_task(1).language
    finally:
        env.close()
    model = build_tiny_pi0([language], TinyPi0Config(action_dim=8, action_horizon=5, max_token_len=32),
                           root=str(tmp_path))
    agent = FlowVLAAgent(FlowVLAAgentConfig(model_path=model, chunk_size=5), 7, ("main_image", "wrist_image"))
    inputs = agent.model_inputs({k: torch.from_numpy(np.asarray(v)[None]) for k, v in obs.items()})
    size = agent.config.vision.image_size
    for image, camera in zip(inputs.images, ("agentview_image", "robot0_eye_in_hand_image"), strict=True):
        rotated = torch.from_numpy(np.ascontiguousarray(raw[camera][::-1, ::-1]))[None]
        expected = resize_with_pad(rotated, size, size).permute(0, 3, 1, 2).float() / 255 * 2 - 1
        assert torch.equal(image, expected), camera
    state = np.concatenate([raw["robot0_eef_pos"], quat2axisangle(raw["robot0_eef_quat"]), raw["robot0_gripper_qpos"]])
    np.testing.assert_allclose(inputs.state[0, :8].numpy(), state, atol=1e-5)
    assert (inputs.state[0, 8:] == 0).all()  # zero-padded to the model's width
    ids, mask = tokenize_prompts(agent.tokenizer, [language], 32)
    width = inputs.tokens.shape[1]  # cut to the prompt's length (rounded up to 8): padding only goes
    assert width % 8 == 0 and not mask[:, width:].any()
    assert torch.equal(inputs.tokens, torch.from_numpy(ids[:, :width]))
    assert torch.equal(inputs.token_mask, torch.from_numpy(mask[:, :width]))
