"""pi0 and pi0.5 (`fleetrl.agents.pi0.model`) as a fleetrl agent: acting, RL and teacher forcing.

The base model comes from `model_path`: a pi0 or pi0.5 checkpoint folder (openpi's,
LeRobot's or RLinf's layout, `pi0_checkpoint.load_pi0`), or a transformers PaliGemma
folder, whose prefix is kept and whose action expert starts fresh (`variant` pi0 or pi05,
`expert_width` wide), for training a new policy from a VLM. The tokenizer is the folder's
or `tokenizer_path`'s (a local PaliGemma tokenizer; nothing downloads); the statistics
are the folder's norm_stats.json (`asset_id` chooses one).

One inference step: the env's images (uint8, any size: resized with pad to the model's,
as openpi's client does) fill the camera slots in `image_keys`' order (the slots with no
key are left out, which is what openpi's masked slots amount to); the state is normalized
(z-score for pi0, quantiles for pi0.5) and zero-padded; the instruction becomes openpi's
prompt. The prefix runs once, its keys and values reused by every denoise step
(`fleetrl.agents.pi0.sampler`: openpi's Euler grid, some steps Gaussian for RL). The
first `chunk_size` actions of the H-action chunk are executed, in the task's first
`action_dim` dims, unnormalized (plus the state's first `delta_action_dims`, pi0_libero's
delta actions); the log-probs count those entries only.

The value head (RLinf's MLP): on the mean of the expert's action-token states at the
chunk's stochastic denoise step (detached; pi0's default, `value_input=expert`), or on
the prefix's pooled states (pi0.5's, `value_input=prefix`).

`step` outputs, per sample: `actions` [B, chunk, D] (the env's scale), `chain` [B, K+1, H,
W] and `stochastic` [B, K] (the learner keeps them), `log_prob` [B, chunk, D], `baseline`
[B]. `unroll` with the recorded actions (training) outputs `chain_log_prob`, `baseline`,
and `flow_matching_error` [T, B, chunk, D] where the observation holds the oracle's chunk.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn
from torch.utils import _pytree as pytree

from fleetrl.agents.base import Agent, AgentOutput, Observation, State
from fleetrl.agents.hf.lora import LoraSpec, add_lora, merged
from fleetrl.agents.hf.pretrained_base import PretrainedBase, import_transformers
from fleetrl.agents.pi0.agent_config import FlowVLAAgentConfig
from fleetrl.agents.pi0.checkpoint import load_pi0, save_pi0
from fleetrl.agents.pi0.model import (
    GemmaSize,
    Pi0Config,
    Pi0Inputs,
    Pi0Model,
    PrefixCache,
    SiglipSize,
    resize_with_pad,
)
from fleetrl.agents.pi0.norm import Normalizer, NormStats, find_norm_stats, read_norm_stats, write_norm_stats
from fleetrl.agents.pi0.prompt import PromptTokenizer
from fleetrl.agents.pi0.sampler import FlowSample, chain_log_prob, sample

EXPORTED_HEADS, EXPORTED_ARCHITECTURE = "fleetrl_heads.pt", "fleetrl_agent.json"

log = logging.getLogger(__name__)


@dataclasses.dataclass
class BaseModel:
    model: Pi0Model
    tokenizer: Any
    norm_stats: NormStats | None


def load_base(model_path: str, dtype: str = "float32", tokenizer_path: str = "", asset_id: str = "",
              variant: str = "pi0", action_width: int = 32, action_horizon: int = 50, expert_width: int = 0,
              max_token_len: int = 0, discrete_state_input: bool | None = None) -> BaseModel:
    """The model, its tokenizer and its statistics from `model_path` (see the module's doc)."""
    found = None
    if _is_paligemma(model_path):
        model = pi0_from_paligemma(model_path, variant, action_width, action_horizon, expert_width, dtype,
                                   max_token_len)
        stats, what = None, f"a PaliGemma prefix with a fresh {variant} action expert"
    else:
        model = load_pi0(model_path, dtype, max_token_len=max_token_len, discrete_state_input=discrete_state_input)
        found = find_norm_stats(model_path, asset_id)
        stats, what = (read_norm_stats(found) if found else None), ("pi0.5" if model.config.pi05 else "pi0")
    tokenizer = _tokenizer(tokenizer_path or model_path, model_path)
    kind = "quantile" if model.config.pi05 else "z-score"
    norm = (f"{found} ({kind}), applied to the state and actions" if found else
            "none found: the state and actions pass unnormalized")
    log.info("loaded %s from %s: %.1fM parameters (%s), tokenizer from %s; normalization: %s", what, model_path,
             sum(p.numel() for p in model.parameters()) / 1e6, dtype, tokenizer_path or model_path, norm)
    return BaseModel(model, tokenizer, stats)


def _is_paligemma(model_path: str) -> bool:
    """True for a transformers PaliGemma folder; a ValueError for another transformers model;
    False for anything else (a pi0 checkpoint, which `load_pi0` checks)."""
    path = os.path.join(model_path, "config.json")
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        architectures = json.load(f).get("architectures") or []
    if not architectures:
        return False
    if architectures[0] != "PaliGemmaForConditionalGeneration":
        raise ValueError(f"--model_path={model_path} holds a {architectures[0]}; the flow VLA takes a pi0 or pi0.5 "
                         "checkpoint (openpi's, LeRobot's or RLinf's layout) or a PaliGemmaForConditionalGeneration")
    return True


def _tokenizer(path: str, model_path: str):
    transformers = import_transformers("pi0's tokenizer")
    if not any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer.model",
                                                                 "tokenizer_config.json")):
        raise ValueError(f"no tokenizer in {path}: a pi0 checkpoint ({model_path}) holds none; pass "
                         "--tokenizer_path=<a local PaliGemma tokenizer folder> (nothing is downloaded)")
    return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


def pi0_from_paligemma(model_path: str, variant: str, action_width: int, action_horizon: int, expert_width: int,
                       dtype: str, max_token_len: int = 0) -> Pi0Model:
    """A pi0 whose prefix is the PaliGemma in `model_path` and whose expert (and the
    projections around it) start fresh: as deep as the PaliGemma, `expert_width` wide (0:
    half its width, as pi0's 1024 beside 2048)."""
    transformers = import_transformers("pi0 on a PaliGemma")
    paligemma = transformers.PaliGemmaForConditionalGeneration.from_pretrained(
        model_path, local_files_only=True, dtype=getattr(torch, dtype))
    text, vision = paligemma.config.text_config, paligemma.config.vision_config
    prefix = GemmaSize(text.hidden_size, text.num_hidden_layers, text.intermediate_size, text.num_attention_heads,
                       text.num_key_value_heads, text.head_dim, text.vocab_size, text.rms_norm_eps,
                       float(text.rope_parameters.get("rope_theta", 10000.0)) if text.rope_parameters else 10000.0)
    width = expert_width or text.hidden_size // 2
    config = Pi0Config(
        pi05=variant == "pi05", paligemma=prefix, expert=dataclasses.replace(prefix, width=width, mlp_dim=4 * width),
        vision=SiglipSize(vision.hidden_size, vision.num_hidden_layers, vision.intermediate_size,
                          vision.num_attention_heads, vision.image_size, vision.patch_size, vision.layer_norm_eps),
        action_dim=action_width, action_horizon=action_horizon, max_token_len=max_token_len or 48)
    model = Pi0Model(config).to(getattr(torch, dtype))
    # transformers 5 names the vision tower's parts one level higher than openpi's (4.x) do.
    weights = {k.replace("model.vision_tower.", "model.vision_tower.vision_model."): v
               for k, v in paligemma.state_dict().items() if not k.startswith("lm_head.")}
    missing, unexpected = model.paligemma_with_expert.paligemma.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"{model_path}: the PaliGemma's weights do not fit pi0's prefix: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    return model.eval()


def fingerprint(config: Pi0Config) -> torch.Tensor:
    """SHA-256 of the model's architecture, as 32 uint8: a checkpoint names the base it fits."""
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(config), sort_keys=True).encode()).digest()
    return torch.tensor(list(digest), dtype=torch.uint8)


class FlowVLAAgent(PretrainedBase, Agent):
    BASE = "pi0"

    def __init__(self, config: FlowVLAAgentConfig, action_dim: int, image_keys: Sequence[str] = ("image",),
                 state_key: str = "state", language_key: str = "language", base: BaseModel | None = None):
        """`config`: the agent's settings (a flow-VLA Problem's config is one), checked there;
        `action_dim`: the task's action dims (the model's first ones); the observation keys
        the agent reads; `base`: a model already loaded, instead of `config.model_path`'s."""
        super().__init__()
        c = config
        model_path, chunk_size, variant = c.model_path, c.chunk_size, c.variant
        base = base or load_base(model_path, c.dtype, c.tokenizer_path, c.asset_id, variant, c.action_width,
                                 c.action_horizon or chunk_size, c.expert_width, c.max_token_len,
                                 c.discrete_state_input or None)
        self.pi0, self.tokenizer = base.model, base.tokenizer
        self.pi0.attention, self.agent_config, a = c.attention, c, c
        c = self.pi0.config
        if not 1 <= action_dim <= c.action_dim:
            raise ValueError(f"action_dim {action_dim} must be in [1, the model's action width {c.action_dim}]")
        if not 1 <= chunk_size <= c.action_horizon:
            raise ValueError(f"chunk_size {chunk_size} must be in [1, the model's action horizon {c.action_horizon}]: "
                             "the executed actions are the first chunk_size of each denoised chunk")
        if len(image_keys) > 3:
            raise ValueError(f"pi0 has 3 camera slots; image_keys names {len(image_keys)}")
        self.model_path, self.action_dim, self.chunk_size = model_path, action_dim, chunk_size
        self.image_keys, self.state_key, self.language_key, self.oracle_key = (tuple(image_keys), state_key,
                                                                              language_key, a.oracle_key)
        self.sampler, self.noise_std_range = a.sampler(), (a.noise_std_min, a.noise_std_max)
        self.normalizer = Normalizer(base.norm_stats, quantile=c.pi05, delta_dims=a.delta_action_dims)
        self.prompts = PromptTokenizer(self.tokenizer, c.max_token_len, a.prompt_bucket)
        self.value_input = a.value_input or ("prefix" if c.pi05 else "expert")
        self.value_pooling, self.value_backprop = a.value_pooling, a.value_backprop
        self.stochastic_eval, self.reuse_prefix_cache = a.stochastic_eval, True
        self.gradient_checkpointing = a.gradient_checkpointing
        # What an exported folder needs to build this agent again (`load_exported`): the
        # agent's settings (the model_path is the folder's) and the task's keys.
        self.architecture = dict(config=agent_settings(a), action_dim=action_dim, image_keys=list(image_keys),
                                 state_key=state_key, language_key=language_key)
        self._set_what_trains(a.train_expert, a.train_vision, a.train_prefix, a.lora(), a.lora_expert)
        expert_width = c.expert.width
        self.noise_head = nn.Linear(expert_width, c.action_dim) if a.noise_method == "flow_noise" else None
        layers: list[nn.Module] = []
        previous = expert_width if self.value_input == "expert" else c.paligemma.width
        for size in a.value_hidden:
            layers += [nn.Linear(previous, size), nn.ReLU()]
            previous = size
        self.value_head = nn.Sequential(*layers, nn.Linear(previous, 1))
        mask = torch.zeros(c.action_horizon, c.action_dim)
        mask[:chunk_size, :action_dim] = 1
        self.register_buffer("log_prob_mask", mask, persistent=False)
        self.register_buffer("base_fingerprint", fingerprint(c))
        self.remember_what_trains()

    def _set_what_trains(self, train_expert: bool, train_vision: bool, train_prefix: bool, lora: LoraSpec | None,
                         lora_expert: bool) -> None:
        pi0 = self.pi0
        paligemma = pi0.paligemma_with_expert.paligemma.model
        for parameter in pi0.parameters():
            parameter.requires_grad_(False)
        for name, parameter in pi0.named_parameters():
            if not name.startswith("paligemma_with_expert.paligemma."):  # the expert and its projections
                parameter.requires_grad_(train_expert)
        for parameter in paligemma.language_model.parameters():
            parameter.requires_grad_(train_prefix)
        for module in (paligemma.vision_tower, paligemma.multi_modal_projector):
            for parameter in module.parameters():
                parameter.requires_grad_(train_vision)
        paligemma.language_model.embed_tokens.requires_grad_(False)  # 0.5B rows; the prompt's few
        if lora is not None:
            add_lora(paligemma.language_model, lora)
            if lora_expert:  # a pretrained expert keeps its weights; adapters train
                add_lora(pi0.paligemma_with_expert.gemma_expert.model, lora)

    @property
    def config(self) -> Pi0Config:
        return self.pi0.config

    # ----- export -----

    def export_pretrained(self, directory: str, asset_id: str = "fleetrl") -> None:
        """Writes the policy in openpi's layout (LoRA merged): `model.safetensors` with openpi's
        keys, config.json and assets/<asset_id>/norm_stats.json, which openpi, LeRobot and
        RLinf serve; beside them the tokenizer, and fleetrl's value head and settings
        (`fleetrl_heads.pt`, `fleetrl_agent.json`), which `load_exported` reads too."""
        save_pi0(merged(self.pi0), directory)
        self.tokenizer.save_pretrained(directory)
        if self.normalizer.stats is not None:
            write_norm_stats(self.normalizer.stats, directory, asset_id)
        heads = {f"{name}.{k}": v for name, module in self.named_children() if name != self.BASE
                 and module is not None for k, v in module.state_dict().items()}
        torch.save(heads, os.path.join(directory, EXPORTED_HEADS))
        with open(os.path.join(directory, EXPORTED_ARCHITECTURE), "w") as f:
            json.dump(self.architecture, f, indent=1)

    # ----- the model's inputs -----

    def _images(self, observation: Observation) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        size = self.config.vision.image_size
        images, masks = [], []
        for key in self.image_keys:
            image = observation[key]  # [N, H, W, 3] uint8
            if image.shape[1:3] != (size, size):
                image = resize_with_pad(image, size, size)
            images.append(image.permute(0, 3, 1, 2).float() / 255 * 2 - 1)
            masks.append(torch.ones(len(image), dtype=torch.bool, device=image.device))
        return images, masks

    def model_inputs(self, observation: Observation) -> Pi0Inputs:
        raw = observation[self.state_key].float()
        state = self.normalizer.state(raw.reshape(len(raw), -1))
        if state.shape[-1] > self.config.action_dim:
            raise ValueError(f"the state has {state.shape[-1]} dims, more than the model's {self.config.action_dim}")
        padded = nn.functional.pad(state, (0, self.config.action_dim - state.shape[-1]))
        language = observation[self.language_key].to("cpu", torch.uint8).numpy()
        states = state.detach().cpu().numpy() if self.config.discrete_state_input else None
        ids, mask = self.prompts(language, states)
        images, masks = self._images(observation)
        device = padded.device
        return Pi0Inputs(images, masks, torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device), padded)

    # ----- the prefix and the expert -----

    def prefix(self, inputs: Pi0Inputs) -> PrefixCache:
        return self._checkpointed(self.pi0.prefix_cache, inputs)

    def _checkpointed(self, function, *args):
        """function(*args), its activations recomputed in the backward pass under
        `gradient_checkpointing` when training."""
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)
        return function(*args)

    def _expert_step(self, cache: PrefixCache, inputs: Pi0Inputs, x: torch.Tensor, t: torch.Tensor,
                     rows: torch.Tensor | None, states: list[torch.Tensor] | None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """v(x_t, t) [M, H, W] for the prefix rows `rows` (None: every row, in order, which
        needs no check on the host), and the noise head's std (flow_noise);
        the action tokens' mean state goes to `states` (the value head's input). With
        `reuse_prefix_cache` off, the prefix is computed again (the naive path, for the bench
        and the test that the cache changes nothing)."""
        if not self.reuse_prefix_cache:
            if rows is not None:
                inputs = Pi0Inputs([i[rows] for i in inputs.images], [m[rows] for m in inputs.image_masks],
                                   inputs.tokens[rows], inputs.token_mask[rows], inputs.state[rows])
            cache, rows = self.pi0.prefix_cache(inputs), None
        selected, state = (cache, inputs.state) if rows is None else (cache.select(rows), inputs.state[rows])
        v, out = self._checkpointed(self.pi0.velocity_and_states, selected, state, x, t)
        if states is not None:
            states.append(out.float().mean(1))
        std = None
        if self.noise_head is not None:
            low, high = self.noise_std_range
            std = low + (high - low) * torch.sigmoid(self.noise_head(out.to(self.noise_head.weight.dtype)).float())
        return v, std

    # ----- the value head -----

    def _prefix_value(self, cache: PrefixCache) -> torch.Tensor:
        hidden = cache.hidden if self.value_backprop else cache.hidden.detach()
        mask = cache.pad.unsqueeze(-1).to(hidden.dtype)
        if self.value_pooling == "mean":
            pooled = (hidden * mask).sum(1) / mask.sum(1)
        elif self.value_pooling == "first":
            pooled = hidden[:, 0]
        else:
            pooled = hidden[torch.arange(len(hidden)), cache.pad.shape[1] - 1 - cache.pad.flip(-1).int().argmax(-1)]
        return self.value_head(pooled.float()).squeeze(-1)

    def _expert_value(self, pooled: torch.Tensor) -> torch.Tensor:
        pooled = pooled if self.value_backprop else pooled.detach()
        return self.value_head(pooled.to(self.value_head[0].weight.dtype)).squeeze(-1)

    # ----- the Agent API -----

    def torso(self, observation: Observation) -> Any:
        return self.prefix(self.model_inputs(observation))

    def head(self, neck_output: Any) -> AgentOutput:
        raise NotImplementedError("FlowVLAAgent.unroll samples or scores chunks itself")

    def sample_chunks(self, observation: Observation, generator: torch.Generator | None = None,
                      noise: torch.Tensor | None = None) -> tuple[FlowSample, torch.Tensor]:
        """A chunk per sample and its value."""
        inputs = self.model_inputs(observation)
        cache = self.prefix(inputs)
        n, c = cache.pad.shape[0], self.config
        if noise is None:
            noise = torch.randn(n, c.action_horizon, c.action_dim, device=cache.hidden.device, generator=generator)
        deterministic = not self.training and not self.stochastic_eval
        states: list[torch.Tensor] = []
        # `sample` steps every row in order, so the expert needs no rows.
        chunk = sample(self.sampler, lambda x, t, _: self._expert_step(cache, inputs, x, t, None, states), noise,
                       self.log_prob_mask, deterministic=deterministic, generator=generator)
        if self.value_input == "prefix":
            return chunk, self._prefix_value(cache)
        per_step = torch.stack(states, dim=1)  # [N, K, W]: the value at the stochastic step(s), else all
        weight = (chunk.stochastic if bool(chunk.stochastic.any(1).all()) else torch.ones_like(chunk.stochastic))
        weight = weight.float().unsqueeze(-1)
        return chunk, self._expert_value((per_step * weight).sum(1) / weight.sum(1))

    def unroll(self, observation: Observation, first: torch.Tensor, state: State,
               actions: dict[str, torch.Tensor] | None = None) -> tuple[AgentOutput, State]:
        num_steps, batch = first.shape
        flat = pytree.tree_map(lambda x: x.reshape(num_steps * batch, *x.shape[2:]), observation)
        d, h = self.action_dim, self.chunk_size
        if actions is None:
            chunk, value = self.sample_chunks(flat)
            env = self.normalizer.env_actions(chunk.actions[:, :h, :d], flat[self.state_key].float())
            out = dict(actions=env, chain=chunk.chain, stochastic=chunk.stochastic,
                       log_prob=chunk.log_prob[:, :h, :d], baseline=value)
        else:
            inputs = self.model_inputs(flat)
            cache = self.prefix(inputs)
            chain = actions["chain"].reshape(num_steps * batch, *actions["chain"].shape[2:]).float()
            stochastic = actions["stochastic"].reshape(num_steps * batch, -1).bool()
            states: list[torch.Tensor] = []
            log_prob = chain_log_prob(self.sampler, lambda x, t, rows: self._expert_step(cache, inputs, x, t, rows,
                                                                                          states),
                                      chain, stochastic, self.log_prob_mask)
            out = {"chain_log_prob": log_prob[:, :h, :d], "baseline": self._training_value(cache, inputs, chain,
                                                                                            stochastic, states)}
            if self.oracle_key in flat:
                out["flow_matching_error"] = self.flow_matching_error(cache, inputs, flat)
        return {k: v.reshape(num_steps, batch, *v.shape[1:]) for k, v in out.items()}, state

    def _training_value(self, cache: PrefixCache, inputs: Pi0Inputs, chain: torch.Tensor, stochastic: torch.Tensor,
                        states: list[torch.Tensor]) -> torch.Tensor:
        """The value as acting computed it: the prefix's, or the expert's at the recorded
        stochastic steps (averaged), read from chain_log_prob's own expert pass."""
        if self.value_input == "prefix":
            return self._prefix_value(cache)
        n = chain.shape[0]
        rows = stochastic.nonzero(as_tuple=True)[0]
        pooled = torch.zeros(n, self.config.expert.width, device=chain.device)
        counts = torch.zeros(n, device=chain.device)
        if rows.numel():
            pooled = pooled.index_add(0, rows, states[0])
            counts = counts.index_add(0, rows, torch.ones_like(rows, dtype=counts.dtype))
        missing = (counts == 0).nonzero(as_tuple=True)[0]
        if missing.numel():  # ODE chains: every step's, as acting averaged them
            k = self.sampler.denoise_steps
            grid = 1 - torch.arange(k, device=chain.device, dtype=torch.float32) / k
            for step in range(k):
                extra: list[torch.Tensor] = []
                self._expert_step(cache, inputs, chain[missing, step], grid[step].expand(len(missing)), missing, extra)
                pooled = pooled.index_add(0, missing, extra[0])
            counts = counts.index_add(0, missing, torch.full_like(missing, k, dtype=counts.dtype))
        return self._expert_value(pooled / counts.unsqueeze(-1))

    def flow_matching_error(self, cache: PrefixCache, inputs: Pi0Inputs, observation: Observation) -> torch.Tensor:
        """[N, chunk, D]: pi0's squared error on the oracle's chunks ([N, chunk, D], or [N, D]
        for one action), in the model's scale: x_t = t*e + (1-t)*A, v regressed on e - A,
        t ~ Beta(1.5, 1) * 0.999 + 0.001. The horizon past the chunk is not scored."""
        oracle = observation[self.oracle_key].float()
        n, c = oracle.shape[0], self.config
        raw_state = observation[self.state_key].float().reshape(n, -1)
        known = self.normalizer.model_actions(oracle.reshape(n, self.chunk_size, self.action_dim), raw_state)
        target = torch.zeros(n, c.action_horizon, c.action_dim, device=oracle.device)
        target[:, :self.chunk_size, :self.action_dim] = known
        t = torch.distributions.Beta(1.5, 1.0).sample((n,)).to(oracle.device) * 0.999 + 0.001
        noise = torch.randn_like(target)
        x_t = t.view(-1, 1, 1) * noise + (1 - t.view(-1, 1, 1)) * target
        v, _ = self._expert_step(cache, inputs, x_t, t, None, None)
        return ((v - (noise - target)) ** 2)[:, :self.chunk_size, :self.action_dim]


def load_exported(directory: str, dtype: str = "float32") -> FlowVLAAgent:
    """The policy that `FlowVLAAgent.export_pretrained` wrote to `directory`, in eval mode."""
    path = os.path.join(directory, EXPORTED_ARCHITECTURE)
    if not os.path.isfile(path):
        raise ValueError(f"{directory} holds no exported fleetrl flow VLA (no {EXPORTED_ARCHITECTURE}); an openpi "
                         "checkpoint is a --model_path")
    with open(path) as f:
        architecture = json.load(f)
    settings = architecture.pop("config", None)
    if settings is None:  # written before the agent took one config
        settings = _settings_of_old_export(architecture)
    settings.update(model_path=directory, dtype=dtype, train_expert=False, train_vision=False, train_prefix=False,
                    lora_rank=0, lora_expert=False)
    known = {f.name for f in dataclasses.fields(FlowVLAAgentConfig)}
    config = FlowVLAAgentConfig(**{k: tuple(v) if isinstance(v, list) else v
                                   for k, v in settings.items() if k in known})
    agent = FlowVLAAgent(config, architecture["action_dim"], architecture["image_keys"], architecture["state_key"],
                         architecture["language_key"])
    heads = torch.load(os.path.join(directory, EXPORTED_HEADS), weights_only=True)
    missing, unexpected = nn.Module.load_state_dict(agent, heads, strict=False)
    missing = [k for k in missing if not k.startswith(f"{FlowVLAAgent.BASE}.") and k != "base_fingerprint"]
    if missing or unexpected:
        raise ValueError(f"{directory}: {EXPORTED_HEADS} does not fit {EXPORTED_ARCHITECTURE}: missing {missing}, "
                         f"unexpected {unexpected}")
    return agent.eval()



def agent_settings(config: FlowVLAAgentConfig) -> dict:
    """The agent's own settings out of `config` (a Problem's config holds more), as JSON."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(FlowVLAAgentConfig)}


def _settings_of_old_export(architecture: dict) -> dict:
    """FlowVLAAgentConfig's settings from an export whose fleetrl_agent.json listed the
    agent's keyword arguments (before the agent took one config)."""
    settings = {k: architecture.pop(k) for k in ("chunk_size", "oracle_key", "value_input", "value_pooling",
                                                  "value_hidden", "delta_action_dims") if k in architecture}
    settings.update(architecture.pop("sampler", {}))
    low, high = architecture.pop("noise_std_range", (0.08, 0.16))
    return {**settings, "noise_std_min": low, "noise_std_max": high}


def chunk_shape(model_path: str, action_width: int, action_horizon: int) -> tuple[int, int]:
    """(H, W) of the chains a model at `model_path` denoises, read without building it: a
    checkpoint's own (from its config.json and its weights' names), else the settings'."""
    if _is_paligemma(model_path):
        return action_horizon, action_width
    from fleetrl.agents.pi0.checkpoint import read_config, stored_tensors, weight_files

    config = read_config(model_path, stored_tensors(weight_files(model_path)))
    return config.action_horizon, config.action_dim
