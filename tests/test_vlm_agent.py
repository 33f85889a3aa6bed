"""The vision-language agent on a tiny random LLaVA built here: loading, generation, log-probs
that training recomputes exactly, the lambda-scaled action log-prob, what an update trains,
export, and the errors a user meets."""

import json
import os
import subprocess

import numpy as np
import pytest
import torch

from fleetrl.envs.text_actions import decode_text, encode_text
from fleetrl.learner.inference.env_state_store import build_state_store
from fleetrl.learner.inference.inference_step import InferenceStep, StepRequest
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.learner.training.trainer import Trainer
from fleetrl.losses.batch import UnrollBatch
from fleetrl.problems import load_problem

transformers = pytest.importorskip("transformers", reason="the vlm extra (make install puts it in)")

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def _model_cache(tiny_model_cache):
    """Tiny models are built into a folder of this module's own, not the user's cache."""


def numberline(**hparams):
    return load_problem("gym_cards/numberline_vlm", {k: str(v) for k, v in hparams.items()})


def observations(problem, count, seed=0):
    envs = [problem.make_actor_env() for _ in range(count)]
    obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    return envs, obs


def stack(obs) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.stack([o[k] for o in obs])) for k in obs[0]}


def real_unrolls(problem, agent, unroll_length=2, num_envs=4) -> UnrollBatch:
    """Unrolls of real NumberLine steps through the learner's own inference step."""
    store = build_state_store(problem, agent, unroll_length, CPU)
    unrolls = []
    inference = InferenceStep(problem, agent, PolicyVersion(), store, lambda u: unrolls.append(u) or True, CPU)
    envs, obs = observations(problem, num_envs)
    slots, run_ids = store.allocate(num_envs), np.arange(1, num_envs + 1, dtype=np.uint64)
    reward, terminated = np.zeros(num_envs, np.float32), np.zeros(num_envs, bool)
    for _ in range(unroll_length + 1):
        request = StepRequest(slots=slots, run_ids=run_ids, observation={k: v.numpy() for k, v in stack(obs).items()},
                              extras={}, reward=reward, terminated=terminated, truncated=np.zeros(num_envs, bool))
        actions = inference([request])[0]
        for i, env in enumerate(envs):
            obs[i], reward[i], terminated[i], truncated, _ = env.step({k: v[i] for k, v in actions.items()})
            if terminated[i] or truncated:
                obs[i] = env.reset()[0]
    return UnrollBatch.collate(unrolls)


# ----- the model -----

def test_the_tiny_model_is_a_real_transformers_vlm_that_from_pretrained_loads():
    problem = numberline()
    path = problem.model_path()
    config = json.loads(open(os.path.join(path, "config.json")).read())
    assert config["architectures"] == ["LlavaForConditionalGeneration"]
    assert any(name.endswith(".safetensors") for name in os.listdir(path))
    model = transformers.AutoModelForImageTextToText.from_pretrained(path, local_files_only=True)
    processor = transformers.AutoProcessor.from_pretrained(path, local_files_only=True)
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    # Its tokenizer was trained on the Problem's own text: the prompt takes few tokens.
    assert len(processor.tokenizer(problem.prompt())["input_ids"]) < len(problem.prompt()) / 2
    assert numberline().model_path() == path  # built once, then found


def test_a_missing_model_path_and_an_unsupported_class_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"--model_path=/no/such/model: no model there"):
        numberline(model_path="/no/such/model").make_agent()
    text_only = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2)
    transformers.LlamaForCausalLM(text_only).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"holds a LlamaForCausalLM; this agent supports "
                                         r"LlavaForConditionalGeneration, LlavaNextForConditionalGeneration"):
        numberline(model_path=tmp_path).make_agent()


# ----- acting and scoring -----

@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_training_recomputes_the_log_probs_that_acted(temperature):
    """The analogue of step == unroll: one teacher-forced pass over prompt plus answer scores
    each generated token exactly as generation did, and the value head sees the same state."""
    problem = numberline(temperature=temperature, observation_text="true", max_new_tokens=12)
    torch.manual_seed(0)
    agent = problem.make_agent()
    with torch.no_grad():
        for name, parameter in agent.named_parameters():
            if "lora_B" in name:  # adapters away from zero, so that they take part
                parameter.normal_(0, 0.05)
        # EOS made likely, so that answers end early, at different lengths.
        agent.model.get_output_embeddings().weight[agent.tokenizer.eos_token_id] *= 4
    _, obs = observations(problem, 6)
    batch = stack(obs)
    with torch.no_grad():
        acted, _ = agent.step(batch, torch.zeros(6, dtype=torch.bool), ())
        actions = {k: acted[k].unsqueeze(0) for k in ("tokens", "num_tokens", "thought_tokens")}
        scored, _ = agent.unroll({k: v.unsqueeze(0) for k, v in batch.items()}, torch.zeros(1, 6, dtype=torch.bool),
                                 (), actions)
    assert len(set(acted["num_tokens"].tolist())) > 1  # answers of several lengths, so padding is exercised
    torch.testing.assert_close(scored["token_mask"][0], acted["token_mask"])
    torch.testing.assert_close(scored["token_logprobs"][0], acted["token_logprobs"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(scored["baseline"][0], acted["baseline"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(problem.action_log_prob(scored, actions)[0],
                               problem.action_log_prob(acted, {k: acted[k] for k in actions}), atol=1e-3, rtol=1e-4)


def test_generation_keeps_no_logits_and_no_per_layer_states():
    """What generation holds: no step's full-vocabulary logits, no layer's states but the
    prompt's last one (through the final norm), yet the same log-probs and value."""
    problem = numberline(max_new_tokens=8)
    torch.manual_seed(0)
    agent = problem.make_agent()
    _, obs = observations(problem, 3)
    batch = stack(obs)
    kept = []
    generate = agent.model.generate

    def spy(**kwargs):
        kept.append((kwargs, generate(**kwargs)))
        return kept[-1][1]

    agent.model.generate = spy
    with torch.no_grad():
        acted, _ = agent.step(batch, torch.zeros(3, dtype=torch.bool), ())
        actions = {k: acted[k].unsqueeze(0) for k in ("tokens", "num_tokens", "thought_tokens")}
        scored, _ = agent.unroll({k: v.unsqueeze(0) for k, v in batch.items()}, torch.zeros(1, 3, dtype=torch.bool),
                                 (), actions)
    (kwargs, generated), = kept
    assert not kwargs.get("output_logits") and not kwargs["output_hidden_states"]
    assert getattr(generated, "logits", None) is None and getattr(generated, "hidden_states", None) is None
    torch.testing.assert_close(scored["token_logprobs"][0], acted["token_logprobs"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(scored["baseline"][0], acted["baseline"], atol=1e-4, rtol=1e-4)


def test_the_action_log_prob_scales_the_thoughts_by_lambda():
    problem = numberline(thought_lambda=0.3)
    token_logprobs = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, 0.0],
                                   [-0.5, -0.5, -0.5, -0.5, -0.5, -0.5]])
    mask = torch.tensor([[1.0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    actions = {"thought_tokens": torch.tensor([3, 6])}
    got = problem.action_log_prob({"token_logprobs": token_logprobs, "token_mask": mask}, actions)
    expected = torch.tensor([0.3 * (-1 - 2 - 3) + (-4 - 5), 0.3 * 6 * -0.5])
    torch.testing.assert_close(got, expected)
    # Teacher forcing trains every token of the oracle's answer at full weight.
    torch.testing.assert_close(problem.teacher_forcing_log_prob({"token_logprobs": token_logprobs,
                                                                 "token_mask": mask}, actions),
                               torch.tensor([-15.0, -3.0]))


def test_thought_tokens_end_with_the_action_marker():
    problem = numberline()
    agent = problem.make_agent()
    answer = '{"thoughts": "the target is 3, so I add one", "action": "+"}'
    data, length = encode_text(answer, 256)
    encoded = agent._encode_answers(torch.from_numpy(data)[None], torch.tensor([length]))
    tokens = encoded["tokens"][0, :int(encoded["num_tokens"][0])].tolist()
    thoughts = int(encoded["thought_tokens"][0])
    assert agent.tokenizer.decode(tokens[:thoughts]).endswith('"action":')
    assert '"action":' not in agent.tokenizer.decode(tokens[:thoughts - 1])
    assert tokens[-1] == agent.tokenizer.eos_token_id
    assert decode_text(encoded["text"][0].numpy(), int(encoded["text_length"][0])) == answer


def test_the_byte_offsets_find_the_same_thought_tokens_as_decoding_every_prefix():
    """The tiny VLM's byte-level tokenizer has its per-token byte table; over answers with
    multi-byte characters, added tokens and the marker anywhere, its count is the smallest
    prefix that decodes to hold the marker."""
    agent = numberline().make_agent()
    assert agent._token_bytes is not None
    answers = ['{"thoughts": "the target is 3, so I add one", "action": "+"}', '"action": "-"',
               '{"thoughts": "é ü — 3→4 ✓", "action": "+"}', 'no marker at all', '"ACTION":"+"',
               '{"thoughts": "<image> first", "action": "-"}', 'x' * 40 + '"action":']
    for answer in answers:
        tokens = agent.tokenizer(answer, add_special_tokens=False)["input_ids"] + [agent.tokenizer.eos_token_id]
        text = agent.tokenizer.decode(tokens, skip_special_tokens=True)
        assert int(agent._token_bytes[tokens].sum()) == len(text.encode("utf-8")), answer
        prefixes = [k for k in range(len(tokens) + 1)
                    if '"action":' in agent.tokenizer.decode(tokens[:k], skip_special_tokens=True).lower()]
        assert agent._thought_tokens(tokens, text) == (prefixes[0] if prefixes else len(tokens)), answer


def test_the_observation_text_fills_the_prompt():
    problem = numberline(observation_text="true")
    agent = problem.make_agent()
    _, obs = observations(problem, 2)
    prompts = agent._prompts(stack(obs), 2)
    described = [decode_text(o["observation_text"], o["observation_text_length"]) for o in obs]
    assert described[0] and all(text in prompt for text, prompt in zip(described, prompts))
    assert "{observation_text}" not in prompts[0] and "<image>" in prompts[0]


def test_eval_is_greedy_and_training_samples():
    problem = numberline()
    agent = problem.make_agent()
    _, obs = observations(problem, 4)
    batch, first = stack(obs), torch.zeros(4, dtype=torch.bool)
    agent.eval()
    with torch.no_grad():
        greedy = [agent.step(batch, first, ())[0]["tokens"] for _ in range(2)]
        agent.train()
        sampled = [agent.step(batch, first, ())[0]["tokens"] for _ in range(2)]
    assert torch.equal(greedy[0], greedy[1])
    assert not torch.equal(sampled[0], sampled[1])


def test_a_parse_failure_plays_a_random_legal_action_and_is_counted():
    problem = numberline()
    env = problem.make_actor_env()
    data, length = encode_text("I am not sure.", problem.config.max_text_bytes)
    action = {"tokens": np.zeros(64, np.int64), "num_tokens": np.int64(0), "thought_tokens": np.int64(0),
              "text": data, "text_length": np.int64(length)}
    moves = []
    for seed in range(12):
        env.reset(seed=seed)
        start = env.unwrapped.current
        _, _, _, _, info = env.step(action)
        assert info["parse_failed"] and info["parse_failure_rate"] == 1.0
        moves.append(env.unwrapped.current - start)
    # Legal moves only (0 where the number line ends), and both of them, drawn at random.
    assert set(moves) <= {-1, 0, 1} and {-1, 1} <= set(moves)
    data, length = encode_text('{"thoughts": "up", "action": "+"}', problem.config.max_text_bytes)
    _, _, _, _, info = env.step({**action, "text": data, "text_length": np.int64(length)})
    assert not info["parse_failed"] and info["parse_failure_rate"] == 0.5


# ----- training -----

def test_an_update_trains_only_the_adapters_and_the_value_head():
    problem = numberline(lora_rank=4, learning_rate=1e-2)
    torch.manual_seed(0)
    agent = problem.make_agent()
    batch = real_unrolls(problem, agent)
    before = {name: p.detach().clone() for name, p in agent.named_parameters()}
    Trainer(problem, agent, problem.make_optimizer(agent.parameters()), PolicyVersion(), CPU).update(batch)
    changed = {name for name, p in agent.named_parameters() if not torch.equal(before[name], p)}
    assert changed, "nothing trained"
    assert all("lora_" in name or name.startswith("value_head.") for name in changed), sorted(changed)
    assert any(name.startswith("value_head.") for name in changed) and any("lora_" in n for n in changed)
    # The checkpoint holds exactly what trains, and the base model's fingerprint.
    trainable = {name for name, p in agent.named_parameters() if p.requires_grad}
    assert set(agent.state_dict()) == trainable | {"base_fingerprint"}


def test_full_fine_tuning_and_the_vision_tower_by_flag():
    agent = numberline(lora_rank=0, train_vision="true").make_agent()
    trainable = [name for name, p in agent.named_parameters() if p.requires_grad]
    assert any("language_model" in n for n in trainable) and any("vision_tower" in n for n in trainable)
    assert not any("multi_modal_projector" in n for n in trainable)
    assert not any("lora_" in n for n in trainable)


def test_a_mismatched_base_model_is_refused(tmp_path):
    from fleetrl.agents.vlm.tiny import TinyVLMConfig, build_tiny_vlm

    problem = numberline()
    agent = problem.make_agent()
    other = build_tiny_vlm(problem.corpus(), TinyVLMConfig(text_layers=1), root=str(tmp_path))
    stranger = numberline(model_path=other).make_agent()
    with pytest.raises(ValueError, match=r"trained on another base model .* than " + str(other)):
        stranger.load_state_dict(agent.state_dict())
    agent.load_state_dict(agent.state_dict())  # its own base: fine


def test_export_merges_the_adapters_into_a_folder_from_pretrained_loads(tmp_path, python):
    from fleetrl.learner.run.checkpoint import CHECKPOINT_FORMAT, atomic_save

    problem = numberline(lora_rank=4)
    torch.manual_seed(0)
    agent = problem.make_agent()
    with torch.no_grad():
        for name, parameter in agent.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)
    checkpoint = tmp_path / "ckpt-1.pt"
    atomic_save({"format": CHECKPOINT_FORMAT, "problem": problem.name, "hparams": {"lora_rank": "4"},
                 "policy_version": 1, "model": agent.state_dict()}, str(checkpoint))
    exported = tmp_path / "merged"
    result = subprocess.run([python, "-m", "fleetrl.launch.export", f"--checkpoint={checkpoint}",
                             f"--output={tmp_path / 'model.pt'}", f"--pretrained_dir={exported}"],
                            capture_output=True, text=True, env={**os.environ})
    assert result.returncode == 0, result.stderr
    merged = transformers.AutoModelForImageTextToText.from_pretrained(exported, local_files_only=True)
    assert type(merged).__name__ == "LlavaForConditionalGeneration"
    assert not any("lora" in name for name in merged.state_dict())
    _, obs = observations(problem, 3)
    inputs = agent._inputs(stack(obs))
    with torch.no_grad():
        torch.testing.assert_close(merged(**inputs).logits, agent.model(**inputs).logits, atol=1e-4, rtol=1e-4)
        base = transformers.AutoModelForImageTextToText.from_pretrained(problem.model_path(), local_files_only=True)
        assert not torch.allclose(base(**inputs).logits, merged(**inputs).logits, atol=1e-3)
    value_head = torch.load(exported / "value_head.pt", weights_only=True)
    torch.testing.assert_close(value_head, agent.value_head.state_dict())


def test_export_of_an_agent_that_is_no_pretrained_model_says_so(tmp_path, python):
    from fleetrl.learner.run.checkpoint import CHECKPOINT_FORMAT, atomic_save

    problem = load_problem("cartpole")
    checkpoint = tmp_path / "ckpt-1.pt"
    atomic_save({"format": CHECKPOINT_FORMAT, "problem": "cartpole", "hparams": {}, "policy_version": 1,
                 "model": problem.make_agent().state_dict()}, str(checkpoint))
    result = subprocess.run([python, "-m", "fleetrl.launch.export", f"--checkpoint={checkpoint}",
                             f"--output={tmp_path / 'model.pt'}", f"--pretrained_dir={tmp_path / 'merged'}"],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "cartpole's agent" in result.stderr and "is not a pretrained transformers model" in result.stderr


def test_teacher_forced_episodes_play_the_solvers_answer_and_train_on_it():
    problem = numberline(teacher_forcing_fraction=0.5, lora_rank=4)
    agent = problem.make_agent()
    _, obs = observations(problem, 4)
    batch = stack(obs)
    forced = torch.tensor([True, False, True, False])
    with torch.no_grad():
        out, _ = agent.step(batch, torch.zeros(4, dtype=torch.bool), ())
    actions = problem.select_actor_action(out, batch, {"teacher_forcing": forced})
    for i in range(4):
        played = decode_text(actions["text"][i].numpy(), int(actions["text_length"][i]))
        oracle = decode_text(obs[i]["oracle_text"], obs[i]["oracle_text_length"])
        generated = decode_text(out["text"][i].numpy(), int(out["text_length"][i]))
        assert played == (oracle if forced[i] else generated)
    # The loss's teacher forcing maximizes every token of the solver's answer.
    steps = {k: v.unsqueeze(0) for k, v in actions.items()}
    scored, _ = agent.unroll({k: v.unsqueeze(0) for k, v in batch.items()}, torch.zeros(1, 4, dtype=torch.bool), (),
                             steps)
    log_prob = problem.teacher_forcing_log_prob(scored, steps)[0]
    (-log_prob[forced].sum()).backward()
    assert all(p.grad is not None for n, p in agent.named_parameters() if "lora_B" in n)


def test_teacher_forced_envs_are_not_generated_for_and_play_the_oracle(monkeypatch):
    """Through the learner's inference step: the forced envs' answers are the oracle's, the
    model generates only for the others, and every env's value is its prompt's."""
    problem = numberline(teacher_forcing_fraction=0.5)
    agent = problem.make_agent()
    agent.eval()  # greedy, so that generating for the others does not depend on who joins them
    envs, obs = observations(problem, 4)
    batch = stack(obs)
    forced = torch.tensor([True, False, True, False])
    generated_rows = []
    generate = agent.model.generate
    monkeypatch.setattr(agent.model, "generate",
                        lambda **kw: generated_rows.append(kw["input_ids"].shape[0]) or generate(**kw))
    with torch.inference_mode():
        out, _ = problem.agent_step(agent, batch, torch.ones(4, dtype=torch.bool), (), {"teacher_forcing": forced})
        actions = problem.select_actor_action(out, batch, {"teacher_forcing": forced})
        alone, _ = agent.step(batch, torch.ones(4, dtype=torch.bool), ())
    assert generated_rows == [2, 4]  # the two that play their own answer, then all four without the mask
    assert out["num_tokens"][forced].tolist() == [0, 0] and out["token_mask"][forced].sum() == 0
    for key in ("tokens", "num_tokens", "text", "text_length"):
        torch.testing.assert_close(actions[key][forced], out[f"oracle_{key}"][forced])
        torch.testing.assert_close(actions[key][~forced], alone[key][~forced])
    torch.testing.assert_close(out["baseline"], alone["baseline"], atol=1e-4, rtol=1e-4)


def test_an_eval_snapshot_shares_the_frozen_base_and_copies_what_trains():
    from fleetrl.learner.evaluation.eval_rounds import frozen_copy

    problem = numberline()
    agent = problem.make_agent()
    snapshot = frozen_copy(agent)
    pairs = list(zip(agent.parameters(), snapshot.parameters()))
    frozen = [(a, s) for a, s in pairs if not a.requires_grad]
    trained = [(a, s) for a, s in pairs if a.requires_grad]
    assert frozen and trained
    assert all(a is s for a, s in frozen)
    assert all(a.data_ptr() != s.data_ptr() and not s.requires_grad for a, s in trained)
    # best.pt is the snapshot's state_dict: it keeps what trains though nothing trains in it.
    assert set(snapshot.state_dict()) == set(agent.state_dict())
    copied = sum(s.numel() * s.element_size() for _, s in trained)
    whole = sum(a.numel() * a.element_size() for a, _ in pairs)
    assert copied < 0.5 * whole  # LoRA rank 8 and the value head against the whole tiny model
    _, obs = observations(problem, 2)
    snapshot.eval()
    before = snapshot.step(stack(obs), torch.ones(2, dtype=torch.bool), ())[0]["baseline"]
    with torch.no_grad():
        for a, _ in trained:
            a.add_(1.0)  # training moves the agent; the snapshot stays at its version
    after = snapshot.step(stack(obs), torch.ones(2, dtype=torch.bool), ())[0]["baseline"]
    torch.testing.assert_close(before, after)
