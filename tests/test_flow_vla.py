"""The flow-matching VLA agent on a tiny PaliGemma: one code path for acting and training,
the prefix's cache changing nothing, eval's ODE, and the prefix's class checked by name."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="the vlm extra (make install puts it in)")

from fleetrl.agents.flow_sampler import FlowSamplerConfig  # noqa: E402
from fleetrl.agents.flow_vla import FlowVLAAgent  # noqa: E402
from fleetrl.agents.tiny_paligemma import build_tiny_paligemma  # noqa: E402
from fleetrl.envs.point_reach import COLOURS, PointReachEnv  # noqa: E402

CHUNK, DIMS, WIDTH = 4, 2, 8


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_paligemma([f"go to the {c} target" for c in COLOURS], root=str(tmp_path_factory.mktemp("m")))


def make_agent(model_path, **kwargs) -> FlowVLAAgent:
    torch.manual_seed(0)
    settings = dict(action_dim=DIMS, chunk_size=CHUNK, state_dim=2, action_width=WIDTH, expert_width=32,
                    value_hidden=(32,))
    return FlowVLAAgent(model_path, **{**settings, **kwargs})


def observations(seeds) -> dict[str, torch.Tensor]:
    env = PointReachEnv(oracle_chunk=CHUNK)
    obs = [env.reset(seed=seed)[0] for seed in seeds]
    return {k: torch.from_numpy(np.stack([o[k] for o in obs])) for k in obs[0]}


@pytest.mark.parametrize("method", ["flow_sde", "flow_noise"])
@pytest.mark.parametrize("stochastic_steps", ["one", "all"])
def test_training_scores_what_inference_sampled_step_by_step(model_path, method, stochastic_steps):
    """Three inference steps of two envs (T=1), then one training unroll over them (T=3):
    the same values, and log-probs recomputed from the recorded chains."""
    agent = make_agent(model_path, sampler=FlowSamplerConfig(noise_method=method, stochastic_steps=stochastic_steps))
    steps = [observations([2 * t, 2 * t + 1]) for t in range(3)]
    first = torch.tensor([True, True])
    outs = []
    with torch.no_grad():
        for obs in steps:
            outs.append(agent.step(obs, first, ())[0])
            first = torch.tensor([False, False])
    stacked = {k: torch.stack([o[k] for o in outs]) for k in outs[0]}
    unroll_obs = {k: torch.stack([obs[k] for obs in steps]) for k in steps[0]}
    with torch.no_grad():
        trained, _ = agent.unroll(unroll_obs, torch.zeros(3, 2, dtype=torch.bool), (),
                                  {"chain": stacked["chain"], "stochastic": stacked["stochastic"]})
    assert stacked["actions"].shape == (3, 2, CHUNK, DIMS) and stacked["chain"].shape == (3, 2, 6, CHUNK, WIDTH)
    torch.testing.assert_close(trained["chain_log_prob"], stacked["log_prob"], atol=1e-4, rtol=0)
    torch.testing.assert_close(trained["baseline"], stacked["baseline"], atol=1e-5, rtol=0)
    assert (stacked["log_prob"] != 0).all()  # every real dim has a stochastic step
    assert (stacked["chain"][..., DIMS:] == 0).all()


def test_reusing_the_prefix_cache_equals_computing_the_prefix_at_every_step(model_path):
    agent = make_agent(model_path, sampler=FlowSamplerConfig(stochastic_steps="all"))
    obs = observations(range(5))
    results = []
    for reuse in (True, False):
        agent.reuse_prefix_cache = reuse
        torch.manual_seed(7)
        with torch.no_grad():
            results.append(agent.step(obs, torch.ones(5, dtype=torch.bool), ())[0])
    for key in ("chain", "log_prob", "baseline"):
        torch.testing.assert_close(results[0][key], results[1][key], atol=1e-5, rtol=0)


def test_eval_plays_the_ode_unless_told_to_sample(model_path):
    agent = make_agent(model_path).eval()
    obs = observations(range(3))
    with torch.no_grad():
        torch.manual_seed(1)
        a = agent.step(obs, torch.ones(3, dtype=torch.bool), ())[0]
        torch.manual_seed(2)
        b = agent.step(obs, torch.ones(3, dtype=torch.bool), ())[0]
    assert not a["stochastic"].any() and (a["log_prob"] == 0).all()
    assert not torch.equal(a["actions"], b["actions"])  # the start noise differs; the steps add none
    agent.stochastic_eval = True
    with torch.no_grad():
        c = agent.step(obs, torch.ones(3, dtype=torch.bool), ())[0]
    assert c["stochastic"].sum(1).tolist() == [1, 1, 1]


def test_the_flow_matching_loss_learns_a_demonstrated_chunk(model_path):
    """A few Adam steps on the oracle's chunks lower pi0's loss well below where it starts."""
    agent = make_agent(model_path)
    obs = {k: v[None] for k, v in observations(range(8)).items()}
    first = torch.zeros(1, 8, dtype=torch.bool)
    optimizer = torch.optim.Adam([p for p in agent.parameters() if p.requires_grad], lr=3e-3)
    chain = torch.zeros(1, 8, 6, CHUNK, WIDTH)
    stochastic = torch.zeros(1, 8, 5, dtype=torch.bool)
    stochastic[..., 0] = True
    losses = []
    torch.manual_seed(3)
    for _ in range(60):
        out, _ = agent.unroll(obs, first, (), {"chain": chain, "stochastic": stochastic})
        loss = out["flow_matching_error"].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10]), losses


def test_the_value_head_pools_as_told_and_trains_the_prefix_only_with_value_backprop(model_path):
    obs = observations(range(2))
    values = {}
    for pooling in ("mean", "first", "last"):
        agent = make_agent(model_path, value_pooling=pooling, train_prefix=True)
        out, _ = agent.step(obs, torch.ones(2, dtype=torch.bool), ())
        values[pooling] = out["baseline"].detach()
        out["baseline"].sum().backward()
        assert agent.paligemma.model.language_model.layers[0].self_attn.q_proj.weight.grad is None
    assert not torch.allclose(values["mean"], values["first"]) and not torch.allclose(values["first"], values["last"])
    agent = make_agent(model_path, value_backprop=True, train_prefix=True)
    agent.step(obs, torch.ones(2, dtype=torch.bool), ())[0]["baseline"].sum().backward()
    assert agent.paligemma.model.language_model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_the_prefix_must_be_a_paligemma_in_a_local_folder(model_path, tmp_path):
    from fleetrl.agents.tiny_vlm import build_tiny_vlm

    llava = build_tiny_vlm(["go to the red target"], root=str(tmp_path))
    with pytest.raises(ValueError, match="holds a LlavaForConditionalGeneration; .* PaliGemmaForConditionalGeneration"):
        make_agent(llava)
    with pytest.raises(ValueError, match="no model there"):
        make_agent(str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="action_dim 9"):
        make_agent(model_path, action_dim=9)
