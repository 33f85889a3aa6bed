"""The flow-matching VLA agent on a tiny PaliGemma: one code path for acting and training,
the prefix's cache changing nothing, eval's ODE, and the prefix's class checked by name."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="the vlm extra (make install puts it in)")

from fleetrl.agents.flow_sampler import FlowSamplerConfig  # noqa: E402
from fleetrl.agents.flow_vla import FlowVLAAgent  # noqa: E402
from fleetrl.agents.lora import LoraSpec  # noqa: E402
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


def training_loss(agent, seeds=(0, 1, 2)) -> torch.Tensor:
    """A loss on real chains and the oracle's chunks: the recorded chains' log-prob, the
    flow-matching error and the value, as PPO and teacher forcing read them."""
    obs = observations(seeds)
    with torch.no_grad():
        out, _ = agent.step(obs, torch.ones(len(seeds), dtype=torch.bool), ())
    unroll_obs = {k: v.unsqueeze(0) for k, v in obs.items()}
    torch.manual_seed(1)  # the flow-matching error's t and noise
    trained, _ = agent.unroll(unroll_obs, torch.zeros(1, len(seeds), dtype=torch.bool), (),
                              {"chain": out["chain"].unsqueeze(0), "stochastic": out["stochastic"].unsqueeze(0)})
    return (trained["chain_log_prob"].sum() + trained["flow_matching_error"].sum()
            + trained["baseline"].square().sum())


def test_gradient_checkpointing_gives_the_same_gradients(model_path):
    grads, forwards = [], []
    for checkpointing in (False, True):
        agent = make_agent(model_path, train_prefix=True, train_vision=True, value_backprop=True,
                           gradient_checkpointing=checkpointing)
        calls = []
        for part in (agent.expert, agent.paligemma.model.language_model, agent.paligemma.model.vision_tower):
            part.register_forward_hook(lambda module, args, out: calls.append(module))
        torch.manual_seed(0)
        loss = training_loss(agent)
        before_backward = len(calls)
        loss.backward()
        forwards.append(len(calls) - before_backward)  # recomputations in the backward pass
        grads.append({n: p.grad.clone() for n, p in agent.named_parameters() if p.grad is not None})
    assert forwards[0] == 0 and forwards[1] > 0, forwards
    assert set(grads[0]) == set(grads[1])
    assert any(n.startswith("paligemma.model.language_model.") for n in grads[0])
    assert any(n.startswith("paligemma.model.vision_tower.") for n in grads[0])
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)


def test_lora_trains_adapters_alone_and_the_checkpoint_holds_them(model_path):
    agent = make_agent(model_path, lora=LoraSpec(rank=4), lora_expert=True)
    trainable = {n for n, p in agent.named_parameters() if p.requires_grad}
    prefix_lm = "paligemma.model.language_model."
    assert {n for n in trainable if n.startswith(prefix_lm)} and all(
        "lora_" in n for n in trainable if n.startswith(prefix_lm) or n.startswith("expert."))
    assert any(n.startswith("expert.") and "lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in agent.named_parameters()}
    optimizer = torch.optim.SGD([p for p in agent.parameters() if p.requires_grad], lr=0.1)
    torch.manual_seed(0)
    training_loss(agent).backward()
    optimizer.step()
    changed = {n for n, p in agent.named_parameters() if not torch.equal(before[n], p)}
    assert changed and changed <= trainable
    assert any("lora_B" in n and n.startswith(prefix_lm) for n in changed)
    saved = agent.state_dict()
    # Adapters and everything outside the prefix (the expert's frozen weights too: they are
    # not a pretrained file's); never the prefix's own weights.
    assert not any(n.startswith("paligemma.") and "lora_" not in n for n in saved)
    assert any(n.startswith("expert.") and n.endswith("base_layer.weight") for n in saved)
    fresh = make_agent(model_path, lora=LoraSpec(rank=4), lora_expert=True)
    fresh.load_state_dict(saved)
    agent.eval(), fresh.eval()
    obs = observations([5, 6])
    noise = torch.randn(2, CHUNK, WIDTH)
    with torch.no_grad():
        a = agent.sample_chunks(agent.prefix(obs), obs, noise=noise).actions
        b = fresh.sample_chunks(fresh.prefix(obs), obs, noise=noise).actions
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="train_prefix"):
        make_agent(model_path, lora=LoraSpec(rank=4), train_prefix=True)


def test_a_bfloat16_model_acts_and_trains_with_float32_log_probs(model_path):
    """The prefix and the expert in bfloat16 (as on a GPU); the layers around the expert, the
    log-probs and the value stay float32."""
    agent = make_agent(model_path, dtype="bfloat16")
    assert agent.expert.dtype == torch.bfloat16 and agent.paligemma.dtype == torch.bfloat16
    obs = observations([0, 1])
    with torch.no_grad():
        out, _ = agent.step(obs, torch.ones(2, dtype=torch.bool), ())
    assert out["log_prob"].dtype == torch.float32 and out["baseline"].dtype == torch.float32
    assert torch.isfinite(out["actions"]).all() and (out["log_prob"] != 0).all()
    torch.manual_seed(0)
    training_loss(agent, seeds=(0, 1)).backward()
    expert_grads = [p.grad for n, p in agent.named_parameters() if n.startswith("expert.") and p.grad is not None]
    assert expert_grads and all(torch.isfinite(g).all() for g in expert_grads)
    assert any(g.abs().sum() > 0 for g in expert_grads)
