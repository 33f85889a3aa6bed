"""The running per-pixel image normalizer: its statistics against all images at once, and
the trainer keeping them (once per batch, into checkpoints)."""

import numpy as np
import pytest
import torch

from fleetrl.agents.conv_lstm import ConvLSTMAgent
from fleetrl.agents.observation_norm import RunningImageNorm
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.learner.training.trainer import Trainer
from fleetrl.problems import load_problem


def test_running_statistics_equal_those_of_all_the_images_at_once():
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 256, (n, 6, 5, 3), generator=generator, dtype=torch.uint8) for n in (1, 7, 30, 2)]
    batches.append(torch.randint(0, 256, (4, 3, 6, 5, 3), generator=generator, dtype=torch.uint8))  # [T+1, B, ...]
    norm = RunningImageNorm(6, 5)
    for batch in batches:
        norm.update(batch)
    everything = torch.cat([b.reshape(-1, 6, 5, 3) for b in batches]).permute(0, 3, 1, 2).double()
    assert norm.count.item() == everything.shape[0] == 52
    torch.testing.assert_close(norm.mean, everything.mean(0))
    torch.testing.assert_close(norm.var, everything.var(0, unbiased=False))


def test_pixels_that_never_change_become_zero_and_rare_ones_are_clipped():
    images = torch.full((100, 4, 4, 3), 200, dtype=torch.uint8)
    images[0, 1, 2] = 0  # one dark pixel in a hundred images: 10 standard deviations off
    norm = RunningImageNorm(4, 4)
    norm.update(images)
    out = norm(images)
    assert out.shape == (100, 3, 4, 4)
    untouched = torch.ones(3, 4, 4, dtype=torch.bool)
    untouched[:, 1, 2] = False
    assert (out[:, untouched] == 0).all()
    assert out[0, :, 1, 2].tolist() == [-5.0] * 3
    assert out[1:, :, 1, 2].abs().max() < 0.2


def test_the_trainer_updates_the_agents_statistics_once_per_batch_and_checkpoints_carry_them(unroll_batch):
    problem = load_problem("gym_cards/numberline", {"image_size": "16", "conv_channels": "4,8"})
    assert problem.config.observation_norm == "running"  # NumberLine's default
    agent = problem.make_agent()

    def images(rng, num_envs):
        return {"image": rng.integers(0, 256, size=(num_envs, 16, 16, 3), dtype=np.uint8)}

    batch = unroll_batch(problem, agent, unroll_length=3, num_envs=4, observe=images)
    trainer = Trainer(problem, agent, problem.make_optimizer(agent.parameters()), PolicyVersion(),
                      torch.device("cpu"))
    trainer.update(batch)
    assert agent.pixel_norm.count.item() == 4 * 4  # T+1 steps of 4 envs, once, whatever the epochs
    trainer.update(batch)
    assert agent.pixel_norm.count.item() == 2 * 4 * 4
    restored = problem.make_agent()
    restored.load_state_dict(agent.state_dict())
    torch.testing.assert_close(restored.pixel_norm.mean, agent.pixel_norm.mean)
    assert restored.pixel_norm.count.item() == 32


def test_an_unknown_observation_norm_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown observation_norm 'batch'"):
        load_problem("gym_cards/ezpoints", {"observation_norm": "batch"})
    with pytest.raises(ValueError, match="unknown observation_norm 'batch'"):
        ConvLSTMAgent(16, 3, observation_norm="batch")
