"""The flow-matching VLA agent (pi0 and pi0.5) on tiny models: one code path for acting and
training, the prefix's cache changing nothing, eval's ODE, what trains, and what loads."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="the vlm extra (make install puts it in)")

from fleetrl.agents.pi0.agent_config import FlowVLAAgentConfig  # noqa: E402
from fleetrl.agents.pi0.flow_vla_agent import FlowVLAAgent  # noqa: E402
from fleetrl.agents.pi0.tiny import TinyPi0Config, build_tiny_pi0  # noqa: E402
from fleetrl.envs.point_reach import COLOURS, PointReachEnv  # noqa: E402

CHUNK, HORIZON, DIMS, WIDTH = 3, 5, 2, 8  # 3 of each 5 denoised actions are executed
CORPUS = [f"go to the {c} target" for c in COLOURS]
PREFIX_LM = "pi0.paligemma_with_expert.paligemma.model.language_model."
EXPERT = "pi0.paligemma_with_expert.gemma_expert."


@pytest.fixture(scope="module", params=["pi0", "pi05"])
def model_path(request, tmp_path_factory):
    config = TinyPi0Config(pi05=request.param == "pi05", action_dim=WIDTH, action_horizon=HORIZON)
    return build_tiny_pi0(CORPUS, config, root=str(tmp_path_factory.mktemp("m")))


def make_agent(model_path, action_dim=DIMS, **settings) -> FlowVLAAgent:
    """The agent on `model_path`, with FlowVLAAgentConfig's `settings` over the test's."""
    torch.manual_seed(0)
    config = FlowVLAAgentConfig(model_path=model_path,
                                **{**dict(chunk_size=CHUNK, value_hidden=(32,), denoise_steps=5), **settings})
    return FlowVLAAgent(config, action_dim)


def observations(seeds) -> dict[str, torch.Tensor]:
    env = PointReachEnv(oracle_chunk=CHUNK)
    obs = [env.reset(seed=seed)[0] for seed in seeds]
    return {k: torch.from_numpy(np.stack([o[k] for o in obs])) for k in obs[0]}


@pytest.mark.parametrize("method", ["flow_sde", "flow_noise"])
@pytest.mark.parametrize("stochastic_steps", ["one", "all"])
def test_training_scores_what_inference_sampled_step_by_step(model_path, method, stochastic_steps):
    """Three inference steps of two envs (T=1), then one training unroll over them (T=3):
    the same values, and log-probs recomputed from the recorded chains, over the executed
    actions and the task's dims only."""
    agent = make_agent(model_path, noise_method=method, stochastic_steps=stochastic_steps)
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
    assert stacked["actions"].shape == (3, 2, CHUNK, DIMS) and stacked["log_prob"].shape == (3, 2, CHUNK, DIMS)
    assert stacked["chain"].shape == (3, 2, 6, HORIZON, WIDTH)
    torch.testing.assert_close(trained["chain_log_prob"], stacked["log_prob"], atol=1e-4, rtol=0)
    torch.testing.assert_close(trained["baseline"], stacked["baseline"], atol=1e-5, rtol=0)
    assert (stacked["log_prob"] != 0).all()  # every executed entry has a stochastic step
    assert (stacked["chain"][:, :, -1, :, DIMS:] != 0).all()  # the padding carries noise, as openpi's


def test_reusing_the_prefix_cache_equals_computing_the_prefix_at_every_step(model_path):
    agent = make_agent(model_path, stochastic_steps="all")
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
    """Adam steps on the oracle's chunks lower pi0's loss well below where it starts (the
    random t and noise keep it from 0)."""
    agent = make_agent(model_path, train_vision=True, train_prefix=True)
    obs = {k: v[None] for k, v in observations(range(8)).items()}
    first = torch.zeros(1, 8, dtype=torch.bool)
    optimizer = torch.optim.Adam([p for p in agent.parameters() if p.requires_grad], lr=3e-3)
    chain = torch.zeros(1, 8, 6, HORIZON, WIDTH)
    stochastic = torch.zeros(1, 8, 5, dtype=torch.bool)
    stochastic[..., 0] = True
    losses = []
    torch.manual_seed(3)
    for _ in range(200):
        out, _ = agent.unroll(obs, first, (), {"chain": chain, "stochastic": stochastic})
        loss = out["flow_matching_error"].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert out["flow_matching_error"].shape == (1, 8, CHUNK, DIMS)
    assert np.mean(losses[-20:]) < 0.6 * np.mean(losses[:20]), losses


def test_the_value_head_reads_the_variants_input_and_trains_it_only_with_value_backprop(model_path):
    obs = observations(range(2))
    pi05 = "pi05" in model_path
    agent = make_agent(model_path, train_prefix=True)
    assert agent.value_input == ("prefix" if pi05 else "expert")  # RLinf's: pi0.5 after the VLM, pi0 on the expert
    reads = PREFIX_LM if pi05 else EXPERT
    out, _ = agent.step(obs, torch.ones(2, dtype=torch.bool), ())
    out["baseline"].sum().backward()
    assert all(p.grad is None for n, p in agent.named_parameters() if n.startswith(reads))
    assert all(p.grad is not None for n, p in agent.named_parameters() if n.startswith("value_head."))
    agent = make_agent(model_path, train_prefix=True, value_backprop=True)
    agent.step(obs, torch.ones(2, dtype=torch.bool), ())[0]["baseline"].sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in agent.named_parameters()
               if n.startswith(reads))
    if pi05:
        values = {}
        for pooling in ("mean", "first", "last"):
            with torch.no_grad():
                values[pooling] = make_agent(model_path, value_pooling=pooling).step(
                    obs, torch.ones(2, dtype=torch.bool), ())[0]["baseline"]
        assert not torch.allclose(values["mean"], values["first"])
        assert not torch.allclose(values["first"], values["last"])


def test_by_default_the_expert_trains_and_the_prefix_does_not_as_rlinfs_expert_only_training(model_path):
    agent = make_agent(model_path)
    trainable = {n for n, p in agent.named_parameters() if p.requires_grad}
    assert any(n.startswith(EXPERT) for n in trainable) and any(n.startswith("pi0.action_in_proj") for n in trainable)
    assert not any(n.startswith("pi0.paligemma_with_expert.paligemma.") for n in trainable)
    saved = agent.state_dict()  # what trains, the heads, the fingerprint; never the frozen prefix
    assert not any(n.startswith("pi0.paligemma_with_expert.paligemma.") for n in saved)
    assert any(n.startswith(EXPERT) for n in saved) and "base_fingerprint" in saved


def test_what_does_not_fit_is_refused_by_name(model_path, tmp_path):
    from fleetrl.agents.vlm.tiny import build_tiny_vlm

    llava = build_tiny_vlm(["go to the red target"], root=str(tmp_path))
    with pytest.raises(ValueError, match="holds a LlavaForConditionalGeneration; the flow VLA takes a pi0"):
        make_agent(llava)
    with pytest.raises(ValueError, match="no such folder"):
        make_agent(str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="action_dim 9 must be in \\[1, the model's action width 8\\]"):
        make_agent(model_path, action_dim=9)
    with pytest.raises(ValueError, match="chunk_size 6 must be in \\[1, the model's action horizon 5\\]"):
        make_agent(model_path, chunk_size=6)


def test_building_a_tiny_model_leaves_the_callers_random_stream_alone(tmp_path):
    """A cold cache builds the model (seeding torch), a warm one only reads it: the caller's
    draws after either must be the same, or two runs of one seed diverge on a fresh machine."""
    config = TinyPi0Config(action_dim=WIDTH, action_horizon=HORIZON)

    def draws_after_build(caller_seed: int, root: str) -> torch.Tensor:
        torch.manual_seed(caller_seed)
        build_tiny_pi0(CORPUS, config, root=str(tmp_path / root))
        return torch.rand(4)

    cold, warm = draws_after_build(7, "cache"), draws_after_build(7, "cache")
    torch.testing.assert_close(cold, warm, rtol=0, atol=0)
    torch.manual_seed(7)
    torch.testing.assert_close(cold, torch.rand(4), rtol=0, atol=0)
    draws_after_build(8, "other")  # the weights are the recipe's, whatever the caller's seed
    from safetensors.torch import load_file

    cache, other = (load_file(next((tmp_path / root).rglob("model.safetensors"))) for root in ("cache", "other"))
    assert cache.keys() == other.keys() and all(torch.equal(cache[k], other[k]) for k in cache)


def test_a_paligemma_folder_is_a_prefix_for_a_fresh_expert(tmp_path):
    """A transformers PaliGemma (a VLM) keeps its weights as pi0's prefix; the expert is new."""
    import transformers
    from tiny_paligemma import build_tiny_paligemma  # tests/tiny_paligemma.py

    folder = build_tiny_paligemma(CORPUS, root=str(tmp_path))
    agent = make_agent(folder, variant="pi05", action_width=WIDTH, action_horizon=HORIZON, expert_width=32)
    assert agent.config.pi05 and agent.config.expert.width == 32 and agent.config.action_horizon == HORIZON
    paligemma = transformers.PaliGemmaForConditionalGeneration.from_pretrained(folder, local_files_only=True)
    ours = agent.pi0.paligemma_with_expert.paligemma.model
    torch.testing.assert_close(ours.language_model.layers[0].self_attn.q_proj.weight,
                               paligemma.model.language_model.layers[0].self_attn.q_proj.weight)
    torch.testing.assert_close(ours.vision_tower.vision_model.embeddings.patch_embedding.weight,
                               paligemma.model.vision_tower.embeddings.patch_embedding.weight)
    with torch.no_grad():
        out, _ = agent.step(observations([0, 1]), torch.ones(2, dtype=torch.bool), ())
    assert out["actions"].shape == (2, CHUNK, DIMS) and torch.isfinite(out["log_prob"]).all()


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
        for layer in (agent.pi0.paligemma_with_expert.gemma_expert.model.layers[0].mlp,
                      agent.pi0.paligemma_with_expert.paligemma.model.language_model.layers[0].mlp):
            layer.register_forward_hook(lambda module, args, out: calls.append(module))
        torch.manual_seed(0)
        loss = training_loss(agent)
        before_backward = len(calls)
        loss.backward()
        forwards.append(len(calls) - before_backward)  # recomputations in the backward pass
        grads.append({n: p.grad.clone() for n, p in agent.named_parameters() if p.grad is not None})
    assert forwards[0] == 0 and forwards[1] > 0, forwards
    assert set(grads[0]) == set(grads[1])
    assert any(n.startswith(PREFIX_LM) for n in grads[0]) and any(n.startswith(EXPERT) for n in grads[0])
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)


def test_lora_trains_adapters_alone_and_the_checkpoint_holds_them(model_path):
    agent = make_agent(model_path, lora_rank=4, lora_expert=True)
    trainable = {n for n, p in agent.named_parameters() if p.requires_grad}
    assert {n for n in trainable if n.startswith(PREFIX_LM)} and all(
        "lora_" in n for n in trainable if n.startswith(PREFIX_LM) or n.startswith(EXPERT))
    assert any(n.startswith(EXPERT) and "lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in agent.named_parameters()}
    optimizer = torch.optim.SGD([p for p in agent.parameters() if p.requires_grad], lr=0.1)
    torch.manual_seed(0)
    training_loss(agent).backward()
    optimizer.step()
    changed = {n for n, p in agent.named_parameters() if not torch.equal(before[n], p)}
    assert changed and changed <= trainable
    assert any("lora_B" in n and n.startswith(PREFIX_LM) for n in changed)
    saved = agent.state_dict()
    assert not any(n.startswith("pi0.paligemma_with_expert.paligemma.") and "lora_" not in n for n in saved)
    fresh = make_agent(model_path, lora_rank=4, lora_expert=True)
    fresh.load_state_dict(saved)
    agent.eval(), fresh.eval()
    obs = observations([5, 6])
    noise = torch.randn(2, HORIZON, WIDTH)
    with torch.no_grad():
        a = agent.sample_chunks(obs, noise=noise)[0].actions
        b = fresh.sample_chunks(obs, noise=noise)[0].actions
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="train_prefix"):
        make_agent(model_path, lora_rank=4, train_prefix=True)


def test_a_bfloat16_model_acts_and_trains_with_float32_log_probs(model_path):
    """The prefix and the expert in bfloat16 (as on a GPU) with openpi's float32 islands; the
    log-probs and the value stay float32."""
    agent = make_agent(model_path, dtype="bfloat16")
    expert = agent.pi0.paligemma_with_expert.gemma_expert.model
    assert expert.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert agent.pi0.action_in_proj.weight.dtype == torch.float32
    obs = observations([0, 1])
    with torch.no_grad():
        out, _ = agent.step(obs, torch.ones(2, dtype=torch.bool), ())
    assert out["log_prob"].dtype == torch.float32 and out["baseline"].dtype == torch.float32
    assert torch.isfinite(out["actions"]).all() and (out["log_prob"] != 0).all()
    torch.manual_seed(0)
    training_loss(agent, seeds=(0, 1)).backward()
    expert_grads = [p.grad for n, p in agent.named_parameters() if n.startswith(EXPERT) and p.grad is not None]
    assert expert_grads and all(torch.isfinite(g).all() for g in expert_grads)
    assert any(g.abs().sum() > 0 for g in expert_grads)
