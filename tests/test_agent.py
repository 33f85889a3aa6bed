"""One code path: stepping an agent through a trajectory equals unrolling it, across episode ends."""

import numpy as np
import pytest
import torch
from torch import nn

from fleetrl.agents import Agent, ConvLSTMAgent, LSTMAgent, MLPAgent, VLAAgent, VLNAgent
from fleetrl.envs.libero.env import encode_language


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


def with_statistics(agent):
    """An agent whose running input statistics have seen some images, as a trained one's have."""
    agent.update_statistics(image_observations(5, 4))
    return agent


def manipulation_observations(num_steps, batch):
    tasks = ["open the top drawer", "put the bowl on the plate", "turn on the stove"]
    language = torch.stack([torch.from_numpy(encode_language(tasks[i % 3])) for i in range(num_steps * batch)])
    return {"main_image": torch.randint(0, 256, (num_steps, batch, 24, 24, 3), dtype=torch.uint8),
            "wrist_image": torch.randint(0, 256, (num_steps, batch, 24, 24, 3), dtype=torch.uint8),
            "state": torch.randn(num_steps, batch, 8), "language": language.reshape(num_steps, batch, -1)}


@pytest.mark.parametrize("make_agent, make_obs", [
    (lambda: VLNAgent(vocab_size=20, feature_dim=5, hidden_size=16, embedding_size=8), vln_observations),
    (lambda: ConvLSTMAgent(16, 3, (4, 8), hidden_size=16, lstm_size=8), image_observations),
    (lambda: with_statistics(ConvLSTMAgent(16, 3, (4, 8), hidden_size=16, lstm_size=8, observation_norm="running")),
     image_observations),
    pytest.param(lambda: VLAAgent(chunk_size=3, channels=(4, 8), hidden_size=16, grid=2, text_encoder="minilm",
                                  value_pooling="attention"), manipulation_observations,
                 marks=pytest.mark.libero),  # the sentence encoder comes with the libero extra
    (lambda: VLAAgent(chunk_size=3, channels=(4, 8), hidden_size=16, grid=2, text_encoder="bytes",
                      value_pooling="max"), manipulation_observations),
], ids=["vln", "conv_lstm", "conv_lstm_running_norm", "vla_minilm", "vla_bytes"])
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


@pytest.mark.libero  # the sentence encoder comes with the libero extra
def test_the_vla_agent_reads_the_language_through_the_frozen_sentence_encoder():
    """The embedding is computed once per episode, from the language bytes, and never trained
    or checkpointed; its output is a Gaussian over a chunk of 7-dim actions."""
    torch.manual_seed(0)
    agent = VLAAgent(chunk_size=4, channels=(4, 8), hidden_size=16, grid=2)
    obs = {k: v[0] for k, v in manipulation_observations(1, 3).items()}
    state = agent.initial_state(obs)
    assert state.shape == (3, 384) and not state.requires_grad
    torch.testing.assert_close(state.norm(dim=-1), torch.ones(3))  # MiniLM's embeddings are unit vectors
    assert not torch.allclose(state[0], state[1])  # different instructions, different embeddings
    assert all(not name.startswith(("_model", "encoder")) for name in agent.state_dict())
    assert sum(p.numel() for p in agent.parameters()) < 1_000_000  # the 22M-parameter encoder is not in it
    out, _ = agent.step(obs, torch.ones(3, dtype=torch.bool), state)
    assert out["action_mean"].shape == out["action_log_std"].shape == (3, 4 * 7)
    assert out["baseline"].shape == (3,)
    with pytest.raises(ValueError, match="unknown value_pooling 'sum'"):
        VLAAgent(value_pooling="sum")


def test_the_conv_lstm_agents_gates_do_not_saturate_when_its_torso_scales_up():
    """A ReLU torso's output can grow without bound. In NumberLine and Points24 runs it grew
    40-fold, every LSTM gate saturated, and the hidden state, so the policy, became the same
    for every image: no gradient could undo it (docs/notes/numberline_dips.md). The LSTM reads
    layer-normalized features, so the torso's scale does not reach the gates."""
    from fleetrl.envs.gym_cards.numberline import NumberLineEnv

    env = NumberLineEnv(image_size=32)
    images = []
    for target, current in [(0, 5), (5, 0), (2, 3), (3, 2)]:
        env.target, env.current = target, current
        images.append(env.render())
    obs = {"image": torch.from_numpy(np.stack(images))}
    torch.manual_seed(0)
    agent = ConvLSTMAgent(32, 2)

    def gates_and_hidden():
        with torch.no_grad():
            features = agent.torso(obs)
            gates = features @ agent.core.weight_ih.T + agent.core.bias_ih + agent.core.bias_hh
            hidden, _ = agent.neck(features, agent.initial_state(obs))
        return (gates.abs() > 5).float().mean().item(), hidden.std(0).mean().item()

    saturated, spread = gates_and_hidden()
    with torch.no_grad():
        agent.project[0].weight.mul_(40)
        agent.project[0].bias.mul_(40)
    saturated_scaled, spread_scaled = gates_and_hidden()
    assert saturated_scaled < 0.1, f"{saturated_scaled:.0%} of the gates saturated"
    assert spread_scaled == pytest.approx(spread, rel=0.05)
    assert spread > 0.01
