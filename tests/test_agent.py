"""One code path: stepping an agent through a trajectory equals unrolling it, across episode ends."""

import pytest
import torch
from torch import nn

from fleetrl.agents import Agent, ConvLSTMAgent, LSTMAgent, MLPAgent, VLNAgent


class InstructionAgent(Agent):
    """Its initial state depends on the first observation, as an instruction encoder's does."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(3, 8)
        self.core = nn.GRUCell(3, 8)
        self.out = nn.Linear(8, 2)

    def initial_state(self, observation):
        return {"h": torch.tanh(self.encoder(observation["observation"]))}

    def torso(self, observation):
        return observation["observation"]

    def neck(self, torso_output, state):
        h = self.core(torso_output, state["h"])
        return h, {"h": h}

    def head(self, neck_output):
        return {"policy_logits": self.out(neck_output), "baseline": neck_output.sum(-1)}


AGENTS = {
    "mlp": lambda: MLPAgent(3, 2, (16, 16)),
    "lstm": lambda: LSTMAgent(3, 2, (16,), 8),
    "instruction": InstructionAgent,
}


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_step_by_step_equals_unroll(name):
    torch.manual_seed(0)
    agent = AGENTS[name]()
    num_steps, batch = 9, 4
    obs = {"observation": torch.randn(num_steps, batch, 3)}
    first = torch.zeros(num_steps, batch, dtype=torch.bool)
    first[0] = True
    first[3, 1] = first[4, 2] = first[7, 0] = first[7, 1] = True  # episode boundaries mid-unroll
    state = agent.initial_state({"observation": torch.randn(batch, 3)})

    unrolled, final_state = agent.unroll(obs, first, state)
    step_state, stepped = state, []
    for t in range(num_steps):
        out, step_state = agent.step({"observation": obs["observation"][t]}, first[t], step_state)
        stepped.append(out)
    for key in unrolled:
        torch.testing.assert_close(unrolled[key], torch.stack([o[key] for o in stepped]), rtol=1e-5, atol=1e-6)
    for a, b in zip(torch.utils._pytree.tree_leaves(final_state), torch.utils._pytree.tree_leaves(step_state)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_state_resets_where_an_episode_starts():
    torch.manual_seed(0)
    agent = LSTMAgent(3, 2, (16,), 8)
    obs = torch.randn(1, 2, 3)
    stale = (torch.randn(2, 8), torch.randn(2, 8))
    out_first, _ = agent.unroll({"observation": obs}, torch.tensor([[True, False]]), stale)
    out_fresh, _ = agent.unroll({"observation": obs}, torch.tensor([[False, False]]),
                                agent.initial_state({"observation": obs[0]}))
    # Env 0 started an episode: the stale state is ignored. Env 1 did not: it matters.
    torch.testing.assert_close(out_first["policy_logits"][0, 0], out_fresh["policy_logits"][0, 0])
    assert not torch.allclose(out_first["policy_logits"][0, 1], out_fresh["policy_logits"][0, 1])


def vln_observations(num_steps, batch):
    tokens = torch.randint(3, 20, (num_steps, batch, 7))
    tokens[..., 5:] = 0  # padding
    mask = torch.zeros(num_steps, batch, 6, dtype=torch.int8)
    mask[..., :3] = 1
    return {"instruction": tokens, "pano": torch.randn(num_steps, batch, 36, 5),
            "candidates": torch.randn(num_steps, batch, 6, 5), "candidate_angles": torch.randn(num_steps, batch, 6, 4),
            "candidate_mask": mask}


def image_observations(num_steps, batch):
    return {"image": torch.randint(0, 256, (num_steps, batch, 16, 16, 3), dtype=torch.uint8)}


@pytest.mark.parametrize("make_agent, make_obs", [
    (lambda: VLNAgent(vocab_size=20, feature_dim=5, hidden_size=16, embedding_size=8), vln_observations),
    (lambda: ConvLSTMAgent(16, 3, (4, 8), hidden_size=16, lstm_size=8), image_observations),
], ids=["vln", "conv_lstm"])
def test_task_agents_step_by_step_equal_their_unroll(make_agent, make_obs):
    """The navigation agent's instruction encoding lives in its state and is redone at each
    episode start; stepping (inference, T=1) and unrolling (training) agree all the same."""
    torch.manual_seed(0)
    agent = make_agent()
    num_steps, batch = 6, 3
    obs = make_obs(num_steps, batch)
    first = torch.zeros(num_steps, batch, dtype=torch.bool)
    first[0] = True
    first[2, 1] = first[4, 0] = True
    state = agent.initial_state({k: v[0] for k, v in obs.items()})
    unrolled, final_state = agent.unroll(obs, first, state)
    step_state, stepped = state, []
    for t in range(num_steps):
        out, step_state = agent.step({k: v[t] for k, v in obs.items()}, first[t], step_state)
        stepped.append(out)
    for key in unrolled:
        torch.testing.assert_close(unrolled[key], torch.stack([o[key] for o in stepped]), rtol=1e-5, atol=1e-5)
    if "candidate_mask" in obs:  # masked slots are never chosen
        assert (unrolled["policy_logits"][..., 3:] < -1e8).all()
