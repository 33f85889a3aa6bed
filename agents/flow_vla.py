"""A pi0-class flow-matching vision-language-action policy (Black et al. 2024) as a fleetrl agent.

- The prefix: a transformers PaliGemma (SigLIP vision tower, projector, Gemma) reads the
  camera images (`image_keys`, each through the vision tower), the instruction (UTF-8 bytes
  under `language_key`, tokenized by the model's tokenizer) and the proprioceptive state
  (`state_key`, one projected token), with full attention inside the prefix. It runs once
  per inference step; its keys and values are cached.
- The action expert: a Gemma decoder built from a config, as many layers, heads and head
  dims as the prefix's language model but `expert_width` wide, so that each of its layers
  attends to that layer's cached prefix keys and values (block-causal, as pi0: the H action
  tokens see the prefix and each other; the prefix never sees them). An action token is
  the noisy action (padded to `action_width`; the padded dims are always zero) embedded
  with a sinusoidal time embedding through an MLP; the expert's output is the velocity.
- Sampling is `fleetrl.agents.flow_sampler`: K denoise steps that reuse the prefix's cache,
  some of them stochastic for RL; eval plays the ODE unless `stochastic_eval`.
- The value head: an MLP on the prefix's last-layer states, pooled by `value_pooling`
  (mean, first or last token); it trains the prefix only with `value_backprop`.

A checkpoint (`state_dict`) holds the expert, the heads, whatever of the prefix trains and
the prefix's config fingerprint, never the frozen prefix (`fleetrl.agents.pretrained_base`).

`step` (inference) outputs, per sample: `actions` [B, H, D] (the task's dims), `chain`
[B, K+1, H, action_width], `stochastic` [B, K], `log_prob` [B, H, D], `baseline` [B].
`unroll` with the recorded actions (training) outputs `chain_log_prob` [T, B, H, D] (the
recorded chains under the current weights), `baseline`, and `flow_matching_error`
[T, B, H, D] where the observation holds the oracle's chunk (`oracle_key`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn
from torch.utils import _pytree as pytree

from fleetrl.agents.base import Agent, AgentOutput, Observation, State
from fleetrl.agents.flow_sampler import FlowSample, FlowSamplerConfig, chain_log_prob, sample
from fleetrl.agents.lora import LoraSpec, add_lora, merged
from fleetrl.agents.pretrained_base import PretrainedBase, check_model_folder, fingerprint, import_transformers
from fleetrl.agents.vlm import architecture_of

SUPPORTED = ("PaliGemmaForConditionalGeneration",)
VALUE_POOLINGS = ("mean", "first", "last")


def _transformers():
    return import_transformers("the flow-matching VLA")


def load_paligemma(model_path: str, dtype: torch.dtype) -> tuple[nn.Module, Any, tuple[float, float]]:
    """The model, tokenizer and image (mean, std) in the local folder `model_path` (never the hub)."""
    transformers = _transformers()
    check_model_folder(model_path, architecture_of, SUPPORTED, "the flow VLA's prefix")
    model = transformers.PaliGemmaForConditionalGeneration.from_pretrained(model_path, local_files_only=True,
                                                                         dtype=dtype)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    stats = (0.5, 0.5)  # SigLIP's normalization, unless the folder's image processor says otherwise
    processor_file = os.path.join(model_path, "preprocessor_config.json")
    if os.path.isfile(processor_file):
        with open(processor_file) as f:
            processor = json.load(f)
        stats = (float(processor.get("image_mean", [0.5])[0]), float(processor.get("image_std", [0.5])[0]))
    return model, tokenizer, stats


EXPORTED_WEIGHTS, EXPORTED_ARCHITECTURE = "flow_vla.pt", "flow_vla.json"


def load_exported(directory: str, dtype: str = "float32") -> FlowVLAAgent:
    """The policy that `FlowVLAAgent.export_pretrained` wrote to `directory`, in eval mode."""
    path = os.path.join(directory, EXPORTED_ARCHITECTURE)
    if not os.path.isfile(path):
        raise ValueError(f"{directory} holds no exported flow VLA (no {EXPORTED_ARCHITECTURE})")
    with open(path) as f:
        architecture = json.load(f)
    architecture["sampler"] = FlowSamplerConfig(**architecture["sampler"])
    architecture["noise_std_range"] = tuple(architecture["noise_std_range"])
    agent = FlowVLAAgent(directory, dtype=dtype, **architecture)
    weights = torch.load(os.path.join(directory, EXPORTED_WEIGHTS), weights_only=True)
    missing, unexpected = nn.Module.load_state_dict(agent, weights, strict=False)
    missing = [k for k in missing if not k.startswith(f"{FlowVLAAgent.BASE}.") and k != "base_fingerprint"]
    if missing or unexpected:
        raise ValueError(f"{directory}: {EXPORTED_WEIGHTS} does not fit {EXPORTED_ARCHITECTURE}: missing {missing}, "
                         f"unexpected {unexpected}")
    return agent.eval()


def time_embedding(t: torch.Tensor, width: int, min_period: float = 4e-3, max_period: float = 4.0) -> torch.Tensor:
    """pi0's sinusoidal embedding of t [M] -> [M, width], periods from min to max."""
    periods = min_period * (max_period / min_period) ** torch.linspace(0, 1, width // 2, device=t.device)
    angles = t.float().unsqueeze(-1) * (2 * math.pi / periods)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


class Prefix:
    """The prefix of N samples: its cache, which tokens are real ([N, P] bool), each one's
    position, and its last-layer states [N, P, W]."""

    def __init__(self, cache: Any, mask: torch.Tensor, hidden: torch.Tensor):
        self.cache, self.mask, self.hidden = cache, mask, hidden
        self.length = mask.sum(-1)  # real tokens; the suffix's positions follow them

    def rows(self, rows: torch.Tensor, cache_class: type, config: Any) -> Any:
        """A cache of the prefix rows `rows` (a sample may appear several times)."""
        cache = cache_class(config=config)
        for i, layer in enumerate(self.cache.layers):
            cache.update(layer.keys[rows], layer.values[rows], i)
        return cache


class FlowVLAAgent(PretrainedBase, Agent):
    BASE = "paligemma"

    def __init__(self, model_path: str, action_dim: int, chunk_size: int, state_dim: int, action_width: int = 32,
                 image_keys: Sequence[str] = ("image",), state_key: str = "state", language_key: str = "language",
                 oracle_key: str = "oracle_action", sampler: FlowSamplerConfig = FlowSamplerConfig(),
                 expert_width: int | None = None, noise_std_range: tuple[float, float] = (0.08, 0.16),
                 value_pooling: str = "mean", value_hidden: Sequence[int] = (512, 256, 128),
                 value_backprop: bool = False, train_vision: bool = False, train_prefix: bool = False,
                 stochastic_eval: bool = False, reuse_prefix_cache: bool = True, max_language_tokens: int = 64,
                 dtype: str = "float32", lora: LoraSpec | None = None, lora_expert: bool = False,
                 gradient_checkpointing: bool = False):
        super().__init__()
        # What an exported folder needs to build this agent again (`load_exported`).
        self.architecture = dict(action_dim=action_dim, chunk_size=chunk_size, state_dim=state_dim,
                                 action_width=action_width, image_keys=list(image_keys), state_key=state_key,
                                 language_key=language_key, oracle_key=oracle_key,
                                 sampler=dataclasses.asdict(sampler), expert_width=expert_width,
                                 noise_std_range=list(noise_std_range), value_pooling=value_pooling,
                                 value_hidden=list(value_hidden), max_language_tokens=max_language_tokens)
        if not 1 <= action_dim <= action_width:
            raise ValueError(f"action_dim {action_dim} must be in [1, action_width={action_width}]")
        if value_pooling not in VALUE_POOLINGS:
            raise ValueError(f"unknown value_pooling {value_pooling!r}; choose from {VALUE_POOLINGS}")
        if lora is not None and train_prefix:
            raise ValueError("lora_rank > 0 trains the prefix's language model through adapters; "
                             "train_prefix (its full fine-tuning) must be false with it")
        if lora_expert and lora is None:
            raise ValueError("lora_expert needs lora_rank > 0")
        transformers = _transformers()
        self.model_path, self.action_dim, self.chunk_size, self.action_width = (model_path, action_dim, chunk_size,
                                                                              action_width)
        self.image_keys, self.state_key, self.language_key, self.oracle_key = (tuple(image_keys), state_key,
                                                                              language_key, oracle_key)
        self.sampler, self.noise_std_range = sampler, noise_std_range
        self.value_pooling, self.value_backprop = value_pooling, value_backprop
        self.stochastic_eval, self.reuse_prefix_cache = stochastic_eval, reuse_prefix_cache
        self.max_language_tokens, self.gradient_checkpointing = max_language_tokens, gradient_checkpointing
        self.paligemma, self.tokenizer, self.image_stats = load_paligemma(model_path, getattr(torch, dtype))
        self._cache_class = transformers.DynamicCache
        text = self.paligemma.config.text_config
        self.image_size = self.paligemma.config.vision_config.image_size
        for parameter in self.paligemma.parameters():
            parameter.requires_grad_(False)
        for parameter in self.paligemma.model.language_model.parameters():
            parameter.requires_grad_(train_prefix)
        for module in (self.paligemma.model.vision_tower, self.paligemma.model.multi_modal_projector):
            for parameter in module.parameters():
                parameter.requires_grad_(train_vision)
        if lora is not None:
            add_lora(self.paligemma.model.language_model, lora)
        if gradient_checkpointing:  # the vision tower keeps no cache: transformers' own checkpointing serves it
            self.paligemma.model.vision_tower.activation_checkpointing_enable()
        width = text.hidden_size
        expert_width = expert_width or width // 2  # pi0: 1024 beside Gemma-2B's 2048
        self.state_token = nn.Linear(state_dim, width)
        self.expert_config = transformers.GemmaConfig(
            vocab_size=1, pad_token_id=None, bos_token_id=None, eos_token_id=None,
            hidden_size=expert_width, intermediate_size=4 * expert_width,
            num_hidden_layers=text.num_hidden_layers, num_attention_heads=text.num_attention_heads,
            num_key_value_heads=text.num_key_value_heads, head_dim=text.head_dim,
            max_position_embeddings=text.max_position_embeddings, rope_parameters=text.rope_parameters,
            initializer_range=text.initializer_range)  # a fresh expert starts at its prefix's scale
        self.expert = transformers.GemmaModel(self.expert_config).to(getattr(torch, dtype))
        self.expert.embed_tokens.requires_grad_(False)  # it reads embeddings, never token ids
        if lora_expert:  # an expert that came trained (a warm start's, pi0's) keeps its weights
            add_lora(self.expert, lora)
        self.action_in = nn.Linear(action_width, expert_width)
        self.time_mlp = nn.Sequential(nn.Linear(2 * expert_width, expert_width), nn.SiLU(),
                                      nn.Linear(expert_width, expert_width))
        self.action_out = nn.Linear(expert_width, action_width)
        self.noise_head = nn.Linear(expert_width, action_width) if sampler.noise_method == "flow_noise" else None
        layers: list[nn.Module] = []
        previous = width
        for size in value_hidden:
            layers += [nn.Linear(previous, size), nn.ReLU()]
            previous = size
        self.value_head = nn.Sequential(*layers, nn.Linear(previous, 1))
        self.register_buffer("action_mask", (torch.arange(action_width) < action_dim).float(), persistent=False)
        self.register_buffer("base_fingerprint", fingerprint(model_path))
        self.remember_what_trains()

    # ----- export -----

    def export_pretrained(self, directory: str) -> None:
        """Writes the fine-tuned policy as a folder: the prefix (LoRA merged) as a PaliGemma
        folder that `from_pretrained` loads, with its tokenizer; beside it `flow_vla.pt`, the
        expert (merged) and the heads, and `flow_vla.json`, the architecture.
        `load_exported(directory)` builds the same policy from it."""
        merged(self.paligemma).save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        processor = os.path.join(self.model_path, "preprocessor_config.json")
        if os.path.isfile(processor):
            shutil.copy(processor, directory)
        weights = {f"expert.{k}": v for k, v in merged(self.expert).state_dict().items()}
        for name, module in self.named_children():
            if name not in (self.BASE, "expert") and module is not None:
                weights.update({f"{name}.{k}": v for k, v in module.state_dict().items()})
        torch.save(weights, os.path.join(directory, EXPORTED_WEIGHTS))
        with open(os.path.join(directory, EXPORTED_ARCHITECTURE), "w") as f:
            json.dump(self.architecture, f, indent=1)

    # ----- the prefix -----

    def _images(self, observation: Observation) -> torch.Tensor:
        """Every camera's image tokens, [N, cameras * tokens, W], one vision pass for all."""
        images = torch.cat([observation[k] for k in self.image_keys])  # [cameras * N, H, W, 3] uint8
        x = images.permute(0, 3, 1, 2).float() / 255
        if x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
            x = nn.functional.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear",
                                          align_corners=False)
        mean, std = self.image_stats
        x = ((x - mean) / std).to(self.paligemma.dtype)
        tokens = self.paligemma.model.get_image_features(x).pooler_output
        return torch.cat(tokens.chunk(len(self.image_keys)), dim=1)

    def _language(self, observation: Observation, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        texts = [bytes(row).rstrip(b"\0").decode("utf-8", errors="replace")
                 for row in observation[self.language_key].to("cpu", torch.uint8).numpy()]
        encoded = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_language_tokens,
                                 return_tensors="pt")
        return encoded["input_ids"].to(device), encoded["attention_mask"].to(device).bool()

    def prefix(self, observation: Observation) -> Prefix:
        images = self._images(observation)
        device = images.device
        ids, language_mask = self._language(observation, device)
        language = self.paligemma.model.language_model.embed_tokens(ids)
        state = self.state_token(observation[self.state_key].float().to(device)).unsqueeze(1).to(images.dtype)
        embeds = torch.cat([images, language, state], dim=1)
        n = embeds.shape[0]
        mask = torch.cat([torch.ones(n, images.shape[1], dtype=torch.bool, device=device), language_mask,
                          torch.ones(n, 1, dtype=torch.bool, device=device)], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        full = mask[:, None, None, :].expand(n, 1, mask.shape[1], mask.shape[1])  # full attention inside
        config = self.paligemma.config.text_config

        def run(embeds: torch.Tensor) -> tuple[torch.Tensor, ...]:
            cache = self._cache_class(config=config)
            out = self.paligemma.model.language_model(inputs_embeds=embeds, attention_mask=full,
                                                      position_ids=positions, cache=cache, use_cache=True)
            return (out.last_hidden_state, *(layer.keys for layer in cache.layers),
                    *(layer.values for layer in cache.layers))

        # Checkpointed, the prefix keeps only its outputs for the backward pass; the cache
        # is built from them outside, so the recomputation never writes it twice.
        hidden, *keys_values = self._checkpointed(run, embeds)
        cache = self._cache_class(config=config)
        layers = len(keys_values) // 2
        for i in range(layers):
            cache.update(keys_values[i], keys_values[layers + i], i)
        return Prefix(cache, mask, hidden)

    def _checkpointed(self, function, *args):
        """function(*args), its activations recomputed in the backward pass under
        `gradient_checkpointing` when training."""
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)
        return function(*args)

    # ----- the expert -----

    def velocity(self, prefix: Prefix, x: torch.Tensor, t: torch.Tensor, rows: torch.Tensor,
                 observation: Observation | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """v(x_t, t) [M, H, A] for the prefix rows `rows`, and the noise head's std (flow_noise).
        With `reuse_prefix_cache` off, the prefix is computed again from `observation` (the
        naive path, for the bench and the test that the cache changes nothing)."""
        # The expert writes its suffix into the prefix's cache and crops it again, so a
        # recomputation finds the cache as the first pass did.
        return self._checkpointed(lambda x, t: self._velocity(prefix, x, t, rows, observation), x, t)

    def _velocity(self, prefix: Prefix, x: torch.Tensor, t: torch.Tensor, rows: torch.Tensor,
                  observation: Observation | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.reuse_prefix_cache and observation is not None:
            prefix = self.prefix(pytree.tree_map(lambda v: v[rows], observation))
            rows = torch.arange(len(rows), device=rows.device)
        h = x.shape[1]
        every_row = torch.arange(len(rows), device=rows.device)
        same_rows = len(rows) == prefix.mask.shape[0] and bool((rows == every_row).all())
        cache = prefix.cache if same_rows else prefix.rows(rows, self._cache_class, self.paligemma.config.text_config)
        width = self.expert_config.hidden_size
        actions = self.action_in((x * self.action_mask).to(self.action_in.weight.dtype))
        times = time_embedding(t, width).to(actions.dtype).unsqueeze(1).expand(-1, h, -1)
        # The small layers around the expert stay in float32 (the log-probs' precision); the
        # expert and the prefix run in the model's dtype.
        suffix = self.time_mlp(torch.cat([actions, times], dim=-1)).to(self.expert.dtype)
        prefix_mask = prefix.mask[rows]
        mask = torch.cat([prefix_mask[:, None, None, :].expand(-1, 1, h, -1),
                          torch.ones(len(rows), 1, h, h, dtype=torch.bool, device=x.device)], dim=-1)
        positions = prefix.length[rows].unsqueeze(-1) + torch.arange(h, device=x.device)
        try:
            out = self.expert(inputs_embeds=suffix, attention_mask=mask, position_ids=positions, cache=cache,
                              use_cache=True).last_hidden_state
        finally:
            if same_rows:
                cache.crop(-h)  # the prefix's cache again, for the next denoise step
        out = out.to(self.action_out.weight.dtype)
        v = self.action_out(out).float() * self.action_mask
        std = None
        if self.noise_head is not None:
            low, high = self.noise_std_range
            std = (low + (high - low) * torch.sigmoid(self.noise_head(out).float())) * self.action_mask
        return v, std

    # ----- the value head -----

    def value(self, prefix: Prefix) -> torch.Tensor:
        hidden = prefix.hidden if self.value_backprop else prefix.hidden.detach()
        mask = prefix.mask.unsqueeze(-1).to(hidden.dtype)
        if self.value_pooling == "mean":
            pooled = (hidden * mask).sum(1) / mask.sum(1)
        elif self.value_pooling == "first":
            pooled = hidden[:, 0]
        else:
            pooled = hidden[torch.arange(len(hidden)), prefix.mask.shape[1] - 1 - prefix.mask.flip(-1).int().argmax(-1)]
        return self.value_head(pooled.float()).squeeze(-1)

    # ----- the Agent API -----

    def torso(self, observation: Observation) -> Prefix:
        return self.prefix(observation)

    def head(self, neck_output: Any) -> AgentOutput:
        raise NotImplementedError("FlowVLAAgent.unroll samples or scores chunks itself")

    def sample_chunks(self, prefix: Prefix, observation: Observation,
                      generator: torch.Generator | None = None, noise: torch.Tensor | None = None) -> FlowSample:
        n = prefix.mask.shape[0]
        if noise is None:
            noise = torch.randn(n, self.chunk_size, self.action_width, device=prefix.hidden.device,
                                generator=generator)
        deterministic = not self.training and not self.stochastic_eval
        return sample(self.sampler, lambda x, t, rows: self.velocity(prefix, x, t, rows, observation), noise,
                      self.action_mask, deterministic=deterministic, generator=generator)

    def unroll(self, observation: Observation, first: torch.Tensor, state: State,
               actions: dict[str, torch.Tensor] | None = None) -> tuple[AgentOutput, State]:
        num_steps, batch = first.shape
        flat = pytree.tree_map(lambda x: x.reshape(num_steps * batch, *x.shape[2:]), observation)
        prefix = self.prefix(flat)
        out = {"baseline": self.value(prefix)}
        d = self.action_dim
        if actions is None:
            chunk = self.sample_chunks(prefix, flat)
            out.update(actions=chunk.actions[..., :d], chain=chunk.chain, stochastic=chunk.stochastic,
                       log_prob=chunk.log_prob[..., :d])
        else:
            chain = actions["chain"].reshape(num_steps * batch, *actions["chain"].shape[2:]).float()
            stochastic = actions["stochastic"].reshape(num_steps * batch, -1).bool()
            log_prob = chain_log_prob(self.sampler, lambda x, t, rows: self.velocity(prefix, x, t, rows, flat),
                                      chain, stochastic, self.action_mask)
            out["chain_log_prob"] = log_prob[..., :d]
            if self.oracle_key in flat:
                out["flow_matching_error"] = self.flow_matching_error(prefix, flat[self.oracle_key], flat)
        return {k: v.reshape(num_steps, batch, *v.shape[1:]) for k, v in out.items()}, state

    def flow_matching_error(self, prefix: Prefix, chunk: torch.Tensor, observation: Observation) -> torch.Tensor:
        """[N, H, D]: pi0's squared error on demonstrated chunks [N, H, D] (or [N, D] for one
        action): x_t = t*e + (1-t)*A, v regressed on e - A, t ~ Beta(1.5, 1) * 0.999 + 0.001."""
        n = chunk.shape[0]
        target = torch.zeros(n, self.chunk_size, self.action_width, device=chunk.device)
        target[..., :self.action_dim] = chunk.float().reshape(n, self.chunk_size, self.action_dim)
        t = torch.distributions.Beta(1.5, 1.0).sample((n,)).to(chunk.device) * 0.999 + 0.001
        noise = torch.randn_like(target) * self.action_mask
        x_t = t.view(-1, 1, 1) * noise + (1 - t.view(-1, 1, 1)) * target
        v, _ = self.velocity(prefix, x_t, t, torch.arange(n, device=chunk.device), observation)
        return ((v - (noise - target)) ** 2)[..., :self.action_dim]
