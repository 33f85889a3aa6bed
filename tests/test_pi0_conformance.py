"""pi0 and pi0.5 against openpi's own outputs (../shared/data/pi0_reference, the spec).

The fixture holds a tiny pi0 and pi0.5 that openpi's PyTorch code built and ran, saved as a
real checkpoint is (real key names, the tied embedding stored once as the lm_head), with
fixed inputs and openpi's outputs. fleetrl loads the folders as they are and must give
the same velocities, sampled actions and training loss within float32 noise (atol 1e-4;
the fixture's README measured kernel differences of about 3e-6), plus the same
resize-with-pad and normalization figures.
"""

import json
import os
import pathlib
import shutil

import numpy as np
import pytest
import torch

from fleetrl.agents.pi0.checkpoint import EXPERT_LM_HEAD, LM_HEAD, keeps_float32, load_pi0, save_pi0
from fleetrl.agents.pi0.model import CAMERAS, Pi0Inputs, resize_with_pad, time_embedding
from fleetrl.agents.pi0.norm import (
    Normalizer,
    discretize_state,
    find_norm_stats,
    read_norm_stats,
)
from fleetrl.agents.pi0.sampler import FlowSamplerConfig, sample

FIXTURE = pathlib.Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "pi0_reference"
pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f"the pi0 reference fixture is not at {FIXTURE} (it is "
                                "beside the repository on development and CI machines, not in a user's clone)")
ATOL = 1e-4
VARIANTS = ("pi0", "pi05")


def arrays(path) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in np.load(path).items()}


@pytest.fixture(scope="module", params=VARIANTS)
def reference(request):
    folder = FIXTURE / request.param
    inputs, outputs = arrays(folder / "inputs.npz"), arrays(folder / "outputs.npz")
    model_inputs = Pi0Inputs([inputs[f"image_{c}"] for c in CAMERAS], [inputs[f"image_mask_{c}"] for c in CAMERAS],
                             inputs["tokenized_prompt"], inputs["tokenized_prompt_mask"], inputs["state"])
    return request.param, load_pi0(str(folder)), model_inputs, inputs, outputs


@torch.no_grad()
def ode_actions(model, inputs: Pi0Inputs, noise: torch.Tensor, steps: int) -> torch.Tensor:
    """openpi's Euler integration from noise to actions, as the agent runs it: the shipped
    sampler's deterministic path over the model's velocity at the prompt's prefix cache."""
    cache = model.prefix_cache(inputs)

    def velocity(x, t, rows):
        return model.velocity(cache.select(rows), inputs.state[rows], x, t), None

    mask = torch.ones(noise.shape[-1])
    return sample(FlowSamplerConfig(denoise_steps=steps), velocity, noise.float(), mask, deterministic=True).actions


def close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    error = (actual.float() - expected.float()).abs().max().item()
    assert error <= ATOL, f"{what}: max |difference| {error:.3g} > {ATOL}"


def test_the_variant_is_read_from_the_weights(reference):
    name, model, *_ = reference
    assert model.config.pi05 == (name == "pi05")
    assert model.config.action_horizon == (10 if name == "pi05" else 50)


def test_the_prefix_matches_openpis(reference):
    _, model, inputs, raw, out = reference
    with torch.no_grad():
        for camera in CAMERAS:
            close(model.embed_image(raw[f"image_{camera}"]), out[f"img_emb_{camera}"], f"{camera}'s tokens")
        embeds, pad, blocks = model.embed_prefix(inputs)
        close(embeds, out["prefix_embs"], "prefix embeddings")
        assert torch.equal(pad, out["prefix_pad_masks"]) and torch.equal(blocks, out["prefix_att_masks"])
        cache = model.prefix_cache(inputs)
    valid = out["prefix_pad_masks"]  # a masked token's state is never read
    close(cache.hidden[valid], out["prefix_out"][valid], "prefix states")


@pytest.mark.parametrize("t, tag", [(1.0, "1p0"), (0.4, "0p4")])
def test_the_velocity_matches_openpis(reference, t, tag):
    _, model, inputs, raw, out = reference
    time = torch.full((2,), t)
    with torch.no_grad():
        embeds, _, blocks, cond = model.embed_suffix(raw["state"], raw[f"x_t_at_{tag}"], time)
        close(embeds, out[f"suffix_embs_t{tag}"], "suffix embeddings")
        assert torch.equal(blocks, out["suffix_att_masks"])
        close(time_embedding(time, model.config.expert.width, 4e-3, 4.0), out[f"time_emb_t{tag}"], "time embedding")
        if model.config.pi05:
            close(cond, out[f"adarms_cond_t{tag}"], "adaptive norms' conditioning")
        velocity = model.velocity(model.prefix_cache(inputs), raw["state"], raw[f"x_t_at_{tag}"], time)
    close(velocity, out[f"v_t{tag}"], f"velocity at t = {t}")


@pytest.mark.parametrize("steps", [10, 5])
def test_sampled_actions_match_openpis(reference, steps):
    _, model, inputs, raw, out = reference
    close(ode_actions(model, inputs, raw["noise"], steps), out[f"actions_steps{steps}"], f"{steps}-step actions")


def test_the_training_loss_matches_openpis_element_by_element(reference):
    _, model, inputs, raw, out = reference
    with torch.no_grad():
        loss = model.loss(inputs, raw["actions"], raw["noise"], raw["time"])
    close(loss, out["loss_elementwise"], "loss")


def test_state_moves_pi0s_actions_but_not_pi05s(reference):
    name, model, inputs, raw, _ = reference
    moved = Pi0Inputs(inputs.images, inputs.image_masks, inputs.tokens, inputs.token_mask, inputs.state + 0.5)
    changed = (ode_actions(model, moved, raw["noise"], 3) - ode_actions(model, inputs, raw["noise"], 3)).abs().max()
    assert (changed > 1e-3) == (name == "pi0"), changed


def test_resize_with_pad_matches_openpis_float_and_uint8_paths():
    data = np.load(FIXTURE / "resize_with_pad.npz")
    resized = resize_with_pad(torch.from_numpy(data["resize_in_float_chw"]), 224, 224)
    close(resized, torch.from_numpy(data["resize_out_float_chw"]), "float resize")
    resized = resize_with_pad(torch.from_numpy(data["resize_in_uint8_hwc"]), 224, 224)
    assert resized.dtype == torch.uint8
    assert torch.equal(resized, torch.from_numpy(data["resize_out_uint8_hwc"]))


def test_normalization_chains_match_openpis_figures():
    """The agent's torch Normalizer against openpi's numpy figures: z-score (pi0) and
    quantile (pi0.5) normalization of the state and actions, unnormalizing the model's
    32-wide chunk (the padding left as it is), and pi0_libero's delta actions."""
    data = {k: torch.from_numpy(v) for k, v in np.load(FIXTURE / "normalization.npz").items()}
    stats = read_norm_stats(find_norm_stats(str(FIXTURE / "norm_stats_example")))
    for quantile, tag in ((False, "zscore"), (True, "quantile")):
        plain = Normalizer(stats, quantile=quantile)
        close(plain.state(data["raw_state"]), data[f"{tag}_state"], f"{tag} state")
        close(plain.model_actions(data["raw_actions"], data["raw_state"]), data[f"{tag}_actions"], f"{tag} actions")
    close(Normalizer(stats, quantile=False).env_actions(data["model_actions"], data["raw_state"]),
          data["pi0_libero_unnormalized_actions32"], "pi0's unnormalized chunk")
    close(Normalizer(stats, quantile=True).env_actions(data["model_actions"], data["raw_state"]),
          data["pi05_libero_unnormalized_actions32"], "pi0.5's unnormalized chunk")
    delta = Normalizer(stats, quantile=False, delta_dims=6)
    close(delta.env_actions(data["model_actions"][..., :7], data["raw_state"]), data["pi0_libero_env_actions"],
          "pi0_libero's delta actions")
    assert np.array_equal(discretize_state(data["quantile_state"].numpy()), data["pi05_discretized_state"].numpy())


@pytest.mark.parametrize("name, quantile, delta", [("pi0", False, 6), ("pi05", True, 0)])
def test_the_agents_torch_normalizer_makes_openpis_libero_chains(name, quantile, delta):
    """The agent's path: the raw state normalized in, the model's chunk (its first 7 dims)
    out to the env's actions, and an oracle's chunk back to the model's scale."""
    data = np.load(FIXTURE / "normalization.npz")
    stats = read_norm_stats(find_norm_stats(str(FIXTURE / "norm_stats_example")))
    normalizer = Normalizer(stats, quantile=quantile, delta_dims=delta)
    raw_state = torch.from_numpy(data["raw_state"])
    state = normalizer.state(raw_state)
    close(state, torch.from_numpy(data[f"{name}_libero_model_state"][:, :8]), "normalized state")
    model = torch.from_numpy(data["model_actions"][..., :7])
    env = normalizer.env_actions(model, raw_state)
    close(env, torch.from_numpy(data[f"{name}_libero_env_actions"]), "env actions")
    close(normalizer.model_actions(env, raw_state), model, "an oracle's chunk back in the model's scale")


# ----- checkpoint layouts -----

@pytest.mark.parametrize("name", VARIANTS)
def test_a_folder_exported_loads_again_with_the_same_actions_and_openpis_keys(tmp_path, name):
    from safetensors import safe_open

    model = load_pi0(str(FIXTURE / name))
    save_pi0(model, str(tmp_path))
    again = load_pi0(str(tmp_path))
    raw = arrays(FIXTURE / name / "inputs.npz")
    inputs = Pi0Inputs([raw[f"image_{c}"] for c in CAMERAS], [raw[f"image_mask_{c}"] for c in CAMERAS],
                       raw["tokenized_prompt"], raw["tokenized_prompt_mask"], raw["state"])
    assert torch.equal(ode_actions(again, inputs, raw["noise"], 4), ode_actions(model, inputs, raw["noise"], 4))
    with safe_open(tmp_path / "model.safetensors", "pt") as written, \
            safe_open(FIXTURE / name / "model.safetensors", "pt") as reference:
        assert set(written.keys()) == set(reference.keys())
        assert LM_HEAD in written.keys() and EXPERT_LM_HEAD in written.keys()


def _save(tensors: dict[str, torch.Tensor], path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


def test_lerobots_prefixed_keys_and_rlinfs_split_files_load_as_openpis(tmp_path):
    from safetensors.torch import load_file

    tensors = load_file(FIXTURE / "pi05" / "model.safetensors")
    config = json.loads((FIXTURE / "pi05" / "config.json").read_text())
    reference = load_pi0(str(FIXTURE / "pi05"))
    raw = arrays(FIXTURE / "pi05" / "inputs.npz")
    inputs = Pi0Inputs([raw[f"image_{c}"] for c in CAMERAS], [raw[f"image_mask_{c}"] for c in CAMERAS],
                       raw["tokenized_prompt"], raw["tokenized_prompt_mask"], raw["state"])
    expected = ode_actions(reference, inputs, raw["noise"], 3)
    lerobot, rlinf = tmp_path / "lerobot", tmp_path / "rlinf"
    lerobot.mkdir()
    _save({f"model.{k}": v for k, v in tensors.items()}, lerobot / "model.safetensors")
    (lerobot / "config.json").write_text(json.dumps(config))
    rlinf.mkdir()
    keys = sorted(tensors)
    _save({k: tensors[k] for k in keys[::2]}, rlinf / "model-00001-of-00002.safetensors")
    _save({k: tensors[k] for k in keys[1::2]}, rlinf / "model-00002-of-00002.safetensors")
    (rlinf / "config.json").write_text(json.dumps(config))
    shutil.copytree(FIXTURE / "norm_stats_example" / "physical-intelligence", rlinf / "physical-intelligence")
    for folder in (lerobot, rlinf):
        assert torch.equal(ode_actions(load_pi0(str(folder)), inputs, raw["noise"], 3), expected), folder.name
    assert find_norm_stats(str(rlinf), "physical-intelligence/libero").endswith(
        os.path.join("physical-intelligence", "libero", "norm_stats.json"))


def test_missing_unexpected_and_misshaped_weights_are_refused_by_name(tmp_path):
    from safetensors.torch import load_file

    tensors = load_file(FIXTURE / "pi0" / "model.safetensors")
    config = (FIXTURE / "pi0" / "config.json").read_text()
    broken = dict(tensors)
    del broken["state_proj.bias"]
    broken["action_in_proj.weight"] = torch.zeros(32, 31)
    broken["value_head.weight"] = torch.zeros(1, 1)
    (tmp_path / "config.json").write_text(config)
    _save(broken, tmp_path / "model.safetensors")
    with pytest.raises(ValueError) as refused:
        load_pi0(str(tmp_path))
    message = str(refused.value)
    assert "missing (1): state_proj.bias" in message and "unexpected (1): value_head.weight" in message
    assert "action_in_proj.weight: (32, 31) in the file, (32, 32) in a pi0" in message
    orbax = tmp_path / "orbax"
    (orbax / "params").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"holds no \*\.safetensors\. A JAX \(orbax\) checkpoint"):
        load_pi0(str(orbax))


def test_bfloat16_keeps_openpis_float32_islands_and_stays_near_float32():
    model = load_pi0(str(FIXTURE / "pi05"), dtype="bfloat16")
    for name, parameter in model.named_parameters():
        assert parameter.dtype == (torch.float32 if keeps_float32(name) else torch.bfloat16), name
    islands = {n for n, _ in model.named_parameters() if keeps_float32(n)}
    assert any("patch_embedding" in n for n in islands) and any("norm.dense" in n for n in islands)
    assert not any("vision_model.encoder" in n and "self_attn" in n for n in islands)
    raw, out = arrays(FIXTURE / "pi05" / "inputs.npz"), arrays(FIXTURE / "pi05" / "outputs.npz")
    inputs = Pi0Inputs([raw[f"image_{c}"] for c in CAMERAS], [raw[f"image_mask_{c}"] for c in CAMERAS],
                       raw["tokenized_prompt"], raw["tokenized_prompt_mask"], raw["state"])
    actions = ode_actions(model, inputs, raw["noise"], 10)
    assert actions.dtype == torch.float32
    error = (actions - out["actions_steps10"]).abs().max().item()
    assert error < 0.1 * out["actions_steps10"].abs().max().item(), error  # bfloat16's 8 bits, not float32's


# ----- the agent, end to end -----

def word_tokenizer(vocab_size: int):
    """A whitespace word tokenizer whose word "w<i>" is id i (BOS 2): the fixture's token ids
    written as text come back as those ids, and "\\n" encodes to nothing, so openpi's prompt
    (BOS, the text, the answer's "\\n") is exactly the fixture's tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("steps", [10, 5])
def test_the_agent_turns_prompt_bytes_and_pixels_into_openpis_actions(name, steps):
    """FlowVLAAgent as the learner runs it: uint8 camera frames, the instruction as bytes and
    the raw 8-dim state in; its prompt tokenizer, image preprocessing and state padding, the
    shipped sampler's deterministic path (openpi's Euler steps) and the unnormalizing out.
    Sample 0 has no right-wrist camera (its key is left out, as a LIBERO env has none)."""
    from fleetrl.agents.pi0.agent_config import FlowVLAAgentConfig
    from fleetrl.agents.pi0.flow_vla_agent import BaseModel, FlowVLAAgent

    folder = FIXTURE / name
    raw, out = arrays(folder / "inputs.npz"), arrays(folder / "outputs.npz")
    model = load_pi0(str(folder))
    tokenizer = word_tokenizer(model.config.paligemma.vocab_size)
    for row, cameras in ((0, CAMERAS[:2]), (1, CAMERAS)):
        config = FlowVLAAgentConfig(model_path=str(folder), chunk_size=model.config.action_horizon,
                                    denoise_steps=steps)
        agent = FlowVLAAgent(config, 32, cameras, base=BaseModel(model, tokenizer, None))
        agent.eval()
        ids = raw["tokenized_prompt"][row][raw["tokenized_prompt_mask"][row]]
        assert ids[0] == 2
        text = ("  " + " ".join(f"w{i}" for i in ids[1:].tolist()) + "\n").encode()
        language = torch.zeros(1, 512, dtype=torch.uint8)
        language[0, :len(text)] = torch.tensor(list(text), dtype=torch.uint8)
        observation = {"language": language, "state": raw["state"][row:row + 1, :8]}
        for camera in cameras:
            pixels = ((raw[f"image_{camera}"][row:row + 1] + 1) / 2 * 255).round().to(torch.uint8)
            observation[camera] = pixels.permute(0, 2, 3, 1).contiguous()
        with torch.no_grad():
            chunk, _ = agent.sample_chunks(observation, noise=raw["noise"][row:row + 1])
            actions = agent.normalizer.env_actions(chunk.actions, observation["state"])
        assert not chunk.stochastic.any()
        close(actions, out[f"actions_steps{steps}"][row:row + 1], f"{name} sample {row}'s {steps}-step actions")


# ----- what the speed-ups may not change -----

def _with_tokens(inputs: Pi0Inputs, tokens: torch.Tensor, mask: torch.Tensor) -> Pi0Inputs:
    return Pi0Inputs(inputs.images, inputs.image_masks, tokens, mask, inputs.state)


def test_cutting_the_prompt_to_its_longest_row_or_filling_its_padding_changes_no_action(reference):
    """Padded prompt slots are neither keys nor positions (the fixture's masks): the prompt
    cut to the batch's longest row, or its padded slots holding other ids, give openpi's
    actions still."""
    _, model, inputs, raw, out = reference
    longest = int(inputs.token_mask.sum(1).max())
    cut = _with_tokens(inputs, inputs.tokens[:, :longest], inputs.token_mask[:, :longest])
    close(ode_actions(model, cut, raw["noise"], 10), out["actions_steps10"], "actions of the cut prompt")
    filled = torch.where(inputs.token_mask, inputs.tokens, torch.full_like(inputs.tokens, 7))
    close(ode_actions(model, _with_tokens(inputs, filled, inputs.token_mask), raw["noise"], 10),
          out["actions_steps10"], "actions with other ids in the padding")


def test_the_eager_kernel_and_the_fused_one_agree(reference):
    _, model, inputs, raw, out = reference
    try:
        model.attention = "eager"
        eager = ode_actions(model, inputs, raw["noise"], 5)
    finally:
        model.attention = "sdpa"
    close(eager, out["actions_steps5"], "eager attention's actions")
    close(ode_actions(model, inputs, raw["noise"], 5), eager, "the fused kernel against the eager one")


def test_the_cache_written_in_place_and_the_joined_one_give_one_velocity(reference):
    """Acting writes each denoise step's keys into the cache's spare slots; training (with
    autograd) joins them to the prefix's. The same velocity either way, step after step."""
    _, model, inputs, raw, out = reference
    with torch.no_grad():
        in_place = model.prefix_cache(inputs)
    assert in_place.suffix_room > 0
    joined = model.prefix_cache(inputs)
    assert joined.suffix_room == 0 and joined.keys[0].requires_grad
    for tag, t in (("1p0", 1.0), ("0p4", 0.4)):
        x, time = raw[f"x_t_at_{tag}"], torch.full((2,), t)
        with torch.no_grad():
            fast = model.velocity(in_place, raw["state"], x, time)
        close(fast, out[f"v_t{tag}"], f"velocity at t = {t} from the cache written in place")
        close(model.velocity(joined, raw["state"], x, time).detach(), fast, "the joined cache's velocity")
