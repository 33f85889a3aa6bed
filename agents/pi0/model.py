"""pi0 and pi0.5 (Physical Intelligence) as openpi's PyTorch `PI0Pytorch` computes them.

One module for both variants; `Pi0Config.pi05` is the difference:
- the prefix: 3 camera slots (SigLIP + projector, unscaled tokens; a masked camera's 256
  tokens are neither keys nor positions), then the prompt's tokens embedded and multiplied
  by sqrt(width); one bidirectional block;
- the suffix, run by the action expert (Gemma layers that never scale their inputs):
  pi0: a state token, then H action tokens (the noisy action and the time embedding through
  an MLP), block flags [1, 1, 0, ...]; pi0.5: H action tokens alone, flags [1, 0, ...], the
  time conditioning every norm of the expert (adaptive RMSNorm: scale, shift, gate);
- one attention per layer over both towers' tokens (`joint_layers`), the prefix never
  seeing the suffix. Inference runs the prefix once (`prefix_cache`) and the expert alone
  per denoise step against its keys and values; training runs both at once (`loss`).

Flow convention (openpi's): t = 1 is noise, t = 0 the data; x_t = t*noise + (1-t)*actions;
the velocity is regressed on noise - actions; sampling is Euler from t = 1 with dt = -1/N.
The module tree and parameter names are openpi's, so its `model.safetensors` loads as is
(`fleetrl.agents.pi0.checkpoint`). Facts: shared/data/pi0_reference/README.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from fleetrl.agents.hf.pretrained_base import import_transformers

CAMERAS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
MASKED = -2.3819763e38  # openpi's additive mask value (the lowest bfloat16-safe float)


@dataclasses.dataclass(frozen=True)
class GemmaSize:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int = 257152
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0


@dataclasses.dataclass(frozen=True)
class SiglipSize:
    width: int = 1152
    depth: int = 27
    mlp_dim: int = 4304
    num_heads: int = 16
    image_size: int = 224
    patch_size: int = 14
    layer_norm_eps: float = 1e-6


# openpi's Gemma variants, by the names its config.json uses.
GEMMA_VARIANTS = {
    "gemma_2b": GemmaSize(2048, 18, 16384, 8, 1, 256),
    "gemma_300m": GemmaSize(1024, 18, 4096, 8, 1, 256),
    "dummy": GemmaSize(64, 4, 128, 8, 1, 16),
}


@dataclasses.dataclass(frozen=True)
class Pi0Config:
    pi05: bool = False
    paligemma: GemmaSize = GEMMA_VARIANTS["gemma_2b"]
    expert: GemmaSize = GEMMA_VARIANTS["gemma_300m"]
    vision: SiglipSize = SiglipSize()
    action_dim: int = 32  # the model's padded action and state width
    action_horizon: int = 50
    max_token_len: int = 48
    discrete_state_input: bool = False  # pi0.5: the state written into the prompt
    min_period: float = 4e-3
    max_period: float = 4.0

    def __post_init__(self):
        p, e = self.paligemma, self.expert
        shared = ("depth", "num_heads", "num_kv_heads", "head_dim")
        differ = [f"{n} {getattr(p, n)} != {getattr(e, n)}" for n in shared if getattr(p, n) != getattr(e, n)]
        if differ:
            raise ValueError(f"the PaliGemma and the action expert share one attention per layer: {', '.join(differ)}")
        if e.width % 2:
            raise ValueError(f"the expert's width {e.width} must be even (the time embedding's sines and cosines)")


def time_embedding(t: torch.Tensor, width: int, min_period: float, max_period: float) -> torch.Tensor:
    """[B] -> [B, width]: all sines, then all cosines; computed in float64 as openpi does."""
    fraction = torch.linspace(0.0, 1.0, width // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = (2 * math.pi / period)[None, :] * t.to(torch.float64)[:, None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1).float()


def attention_mask_2d(pad: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """[B, S] valid tokens and block-start flags -> [B, S, S]: q sees k iff k's block is not
    after q's and both are valid."""
    block = blocks.long().cumsum(-1)
    return (block[:, None, :] <= block[:, :, None]) & pad[:, None, :] & pad[:, :, None]


class AdaptiveRMSNorm(nn.Module):
    """pi0.5's norm: RMS-normalize, then scale, shift (and a gate for the residual) from the
    time conditioning. Its one parameter is `dense`: cond -> [scale, shift, gate]."""

    def __init__(self, width: int, cond_dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * width)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        scale, shift, gate = self.dense(cond.to(self.dense.weight.dtype)).unsqueeze(1).chunk(3, dim=-1)
        return (normed * (1 + scale.float()) + shift.float()).type_as(x), gate.type_as(x)


def _norm(norm: nn.Module, x: torch.Tensor, cond: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(normed x, the residual's gate or None)."""
    return norm(x, cond) if isinstance(norm, AdaptiveRMSNorm) else (norm(x), None)


def _gated(x: torch.Tensor, branch: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    return x + (branch if gate is None else gate * branch)


class GemmaStack(nn.Module):
    """Gemma decoder layers and a final norm (transformers' own layers), with or without the
    token embedding; `adaptive` swaps every norm for `AdaptiveRMSNorm` (pi0.5's expert)."""

    def __init__(self, size: GemmaSize, embed: bool, adaptive_cond_dim: int = 0):
        super().__init__()
        transformers = import_transformers("pi0")
        from transformers.models.gemma.modeling_gemma import GemmaDecoderLayer, GemmaRMSNorm

        config = transformers.GemmaConfig(
            vocab_size=size.vocab_size, hidden_size=size.width, intermediate_size=size.mlp_dim,
            num_hidden_layers=size.depth, num_attention_heads=size.num_heads, num_key_value_heads=size.num_kv_heads,
            head_dim=size.head_dim, rms_norm_eps=size.rms_norm_eps, hidden_activation="gelu_pytorch_tanh",
            attention_bias=False)
        if embed:
            self.embed_tokens = nn.Embedding(size.vocab_size, size.width)
        self.layers = nn.ModuleList(GemmaDecoderLayer(config, i) for i in range(size.depth))

        def norm() -> nn.Module:
            if adaptive_cond_dim:
                return AdaptiveRMSNorm(size.width, adaptive_cond_dim, size.rms_norm_eps)
            return GemmaRMSNorm(size.width, eps=size.rms_norm_eps)

        for layer in self.layers:
            layer.input_layernorm, layer.post_attention_layernorm = norm(), norm()
        self.norm = norm()


class Projector(nn.Module):
    def __init__(self, vision_width: int, width: int):
        super().__init__()
        self.linear = nn.Linear(vision_width, width)


class PaliGemmaParts(nn.Module):
    """The PaliGemma under openpi's names: model.{vision_tower, multi_modal_projector,
    language_model}. Its lm_head is the embedding (tied) and is not kept apart."""

    def __init__(self, config: Pi0Config):
        super().__init__()
        transformers = import_transformers("pi0")
        v = config.vision
        vision = transformers.SiglipVisionConfig(
            hidden_size=v.width, intermediate_size=v.mlp_dim, num_hidden_layers=v.depth,
            num_attention_heads=v.num_heads, image_size=v.image_size, patch_size=v.patch_size,
            layer_norm_eps=v.layer_norm_eps, hidden_act="gelu_pytorch_tanh", vision_use_head=False)
        vision._attn_implementation = "eager"
        self.model = nn.Module()
        self.model.vision_tower = nn.Module()  # openpi's (transformers 4's) names hold one more level
        self.model.vision_tower.vision_model = transformers.SiglipVisionModel(vision)
        self.model.multi_modal_projector = Projector(v.width, config.paligemma.width)
        self.model.language_model = GemmaStack(config.paligemma, embed=True)


class ActionExpert(nn.Module):
    def __init__(self, config: Pi0Config):
        super().__init__()
        self.model = GemmaStack(config.expert, embed=False, adaptive_cond_dim=config.expert.width if config.pi05 else 0)


class PaliGemmaWithExpert(nn.Module):
    def __init__(self, config: Pi0Config):
        super().__init__()
        self.paligemma = PaliGemmaParts(config)
        self.gemma_expert = ActionExpert(config)


@dataclasses.dataclass
class Pi0Inputs:
    """What the model reads, already preprocessed: images [B, 3, S, S] in [-1, 1] per camera
    slot (any size: resized with pad), their masks [B] bool, the tokenized prompt [B, L] and
    its mask, the normalized state [B, action_dim] (zero-padded)."""

    images: Sequence[torch.Tensor]
    image_masks: Sequence[torch.Tensor]
    tokens: torch.Tensor
    token_mask: torch.Tensor
    state: torch.Tensor


@dataclasses.dataclass
class PrefixCache:
    """The prefix's keys and values per layer (after RoPE) and which of its tokens are real.

    Built without autograd (acting), each layer's keys and values [B, kv heads, P + S, d]
    keep `suffix_room` = S slots past the prefix's P: a denoise step writes the suffix's S
    there in place and attends to the whole buffer, instead of concatenating P + S per
    layer and step. With autograd (training) they hold the prefix alone and are joined."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    pad: torch.Tensor
    hidden: torch.Tensor  # its last hidden states (after the final norm), [B, P, width]
    suffix_room: int = 0

    def select(self, rows: torch.Tensor) -> PrefixCache:
        return PrefixCache([k[rows] for k in self.keys], [v[rows] for v in self.values], self.pad[rows],
                           self.hidden[rows], self.suffix_room)

    def joined(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's prefix keys and values followed by the suffix's `keys`, `values`."""
        prefix = self.pad.shape[1]
        if keys.shape[2] == self.suffix_room and not torch.is_grad_enabled():
            self.keys[layer][:, :, prefix:].copy_(keys)
            self.values[layer][:, :, prefix:].copy_(values)
            return self.keys[layer], self.values[layer]
        return (torch.cat([self.keys[layer][:, :, :prefix], keys], 2),
                torch.cat([self.values[layer][:, :, :prefix], values], 2))


class Pi0Model(nn.Module):
    def __init__(self, config: Pi0Config, attention: str = "sdpa"):
        super().__init__()
        if attention not in ATTENTION_KERNELS:
            raise ValueError(f"unknown attention kernel {attention!r}; choose from {sorted(ATTENTION_KERNELS)}")
        self.config = config
        # How the joint attention runs (not part of the architecture: the weights fit either).
        self.attention = attention
        width, a = config.expert.width, config.action_dim
        self.paligemma_with_expert = PaliGemmaWithExpert(config)
        self.action_in_proj = nn.Linear(a, width)
        self.action_out_proj = nn.Linear(width, a)
        if config.pi05:
            self.time_mlp_in = nn.Linear(width, width)
            self.time_mlp_out = nn.Linear(width, width)
        else:
            self.state_proj = nn.Linear(a, width)
            self.action_time_mlp_in = nn.Linear(2 * width, width)
            self.action_time_mlp_out = nn.Linear(width, width)

    @property
    def _paligemma(self) -> nn.Module:
        return self.paligemma_with_expert.paligemma.model

    @property
    def _expert(self) -> GemmaStack:
        return self.paligemma_with_expert.gemma_expert.model

    # ----- the prefix -----

    def embed_image(self, image: torch.Tensor) -> torch.Tensor:
        """[B, 3, S, S] in [-1, 1] -> [B, tokens, width]: SigLIP, then the projector, unscaled."""
        size = self.config.vision.image_size
        if image.shape[-2:] != (size, size):
            image = resize_with_pad(image, size, size)
        tower = self._paligemma.vision_tower.vision_model
        # The patch and position embeddings may stay float32 beside a bfloat16 encoder (openpi's islands).
        hidden = tower.embeddings(image.to(tower.embeddings.patch_embedding.weight.dtype))
        hidden = tower.encoder(inputs_embeds=hidden.to(tower.encoder.layers[0].self_attn.q_proj.weight.dtype))
        hidden = tower.post_layernorm(hidden.last_hidden_state)
        projector = self._paligemma.multi_modal_projector.linear
        return projector(hidden.to(projector.weight.dtype))

    def embed_prefix(self, inputs: Pi0Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(embeddings [B, P, width], valid tokens [B, P], block flags [B, P] all False)."""
        parts, pad = [], []
        for image, mask in zip(inputs.images, inputs.image_masks, strict=True):
            tokens = self.embed_image(image)
            parts.append(tokens)
            pad.append(mask.bool()[:, None].expand(-1, tokens.shape[1]))
        language = self._paligemma.language_model.embed_tokens(inputs.tokens)
        parts.append(language * math.sqrt(language.shape[-1]))
        pad.append(inputs.token_mask.bool())
        dtype = parts[-1].dtype
        embeds = torch.cat([p.to(dtype) for p in parts], dim=1)
        pad_mask = torch.cat(pad, dim=1)
        return embeds, pad_mask, torch.zeros_like(pad_mask)

    # ----- the suffix -----

    def embed_suffix(self, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(embeddings [B, S, expert width], valid [B, S], block flags [B, S], the adaptive
        norms' conditioning [B, width] for pi0.5 else None)."""
        c = self.config
        b, h = x_t.shape[:2]
        time = time_embedding(t, c.expert.width, c.min_period, c.max_period).to(self.action_in_proj.weight.dtype)
        actions = self.action_in_proj(x_t.to(self.action_in_proj.weight.dtype))
        if c.pi05:
            cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(time))))
            tokens, starts = actions, 1  # the block flags [1, 0, ...]
        else:
            cond = None
            state_token = self.state_proj(state.to(self.state_proj.weight.dtype))[:, None]
            mixed = torch.cat([actions, time[:, None].expand(-1, h, -1)], dim=-1)
            actions = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(mixed)))
            tokens, starts = torch.cat([state_token, actions], dim=1), 2  # [1, 1, 0, ...]
        pad = torch.ones(b, tokens.shape[1], dtype=torch.bool, device=x_t.device)
        blocks = torch.zeros_like(pad)  # made on the device: no host copy per denoise step
        blocks[:, :starts] = True
        return tokens, pad, blocks, cond

    # ----- the two towers, one attention per layer -----

    def joint_layers(self, streams: Sequence[tuple[torch.Tensor, GemmaStack] | None], mask: torch.Tensor,
                     positions: torch.Tensor, cond: torch.Tensor | None = None,
                     cache: PrefixCache | None = None) -> tuple[list[torch.Tensor | None], list[torch.Tensor],
                                                                 list[torch.Tensor]]:
        """Runs the streams (embeddings, their tower; None for a tower not run) through every
        layer together: each stream's own norms, projections and MLP, one attention over all
        their tokens (after `cache`'s, when given). `mask` [B, Q, K] over (cache +) streams,
        `positions` [B, Q]. Returns each stream's last states (after its final norm) and each
        layer's keys and values of these streams (after RoPE)."""
        size = self.config.paligemma
        xs = [s[0] if s is not None else None for s in streams]
        live = [i for i, s in enumerate(streams) if s is not None]
        lengths = [xs[i].shape[1] for i in live]
        cos, sin = _rope(positions, size.head_dim, size.rope_theta)
        # In the queries' dtype (the first stream's), as the fused kernels want it.
        bias = torch.where(mask, 0.0, MASKED)[:, None].to(streams[live[0]][1].layers[0].self_attn.q_proj.weight.dtype)
        all_keys, all_values = [], []
        for index in range(size.depth):
            queries, keys, values, gates = [], [], [], {}
            for i in live:
                layer = streams[i][1].layers[index]
                h, gates[i] = _norm(layer.input_layernorm, xs[i], cond if _adaptive(layer) else None)
                b, s = h.shape[:2]
                queries.append(layer.self_attn.q_proj(h).view(b, s, size.num_heads, size.head_dim))
                keys.append(layer.self_attn.k_proj(h).view(b, s, size.num_kv_heads, size.head_dim))
                values.append(layer.self_attn.v_proj(h).view(b, s, size.num_kv_heads, size.head_dim))
            dtype = queries[0].dtype
            q = _rotate(torch.cat([x.to(dtype) for x in queries], 1).transpose(1, 2), cos, sin)
            k = _rotate(torch.cat([x.to(dtype) for x in keys], 1).transpose(1, 2), cos, sin)
            v = torch.cat([x.to(dtype) for x in values], 1).transpose(1, 2)
            all_keys.append(k)
            all_values.append(v)
            if cache is not None:
                k, v = cache.joined(index, k, v)
            out = ATTENTION_KERNELS[self.attention](q, k, v, bias)
            for i, part in zip(live, out.split(lengths, dim=1), strict=True):
                layer = streams[i][1].layers[index]
                x = _gated(xs[i], layer.self_attn.o_proj(part.to(layer.self_attn.o_proj.weight.dtype)), gates[i])
                h, gate = _norm(layer.post_attention_layernorm, x, cond if _adaptive(layer) else None)
                xs[i] = _gated(x, layer.mlp(h), gate)
        outs = [None] * len(streams)
        for i in live:
            stack = streams[i][1]
            outs[i] = _norm(stack.norm, xs[i], cond if isinstance(stack.norm, AdaptiveRMSNorm) else None)[0]
        return outs, all_keys, all_values

    def prefix_cache(self, inputs: Pi0Inputs) -> PrefixCache:
        """The prefix run once: its keys and values for every denoise step."""
        embeds, pad, blocks = self.embed_prefix(inputs)
        mask = attention_mask_2d(pad, blocks)
        positions = pad.long().cumsum(-1) - 1
        (hidden, _), keys, values = self.joint_layers([(embeds, self._paligemma.language_model), None], mask,
                                                      positions)
        if torch.is_grad_enabled():
            return PrefixCache(keys, values, pad, hidden)
        room = self.config.action_horizon + (0 if self.config.pi05 else 1)  # the suffix's tokens
        keys, values = ([torch.cat([x, x.new_empty(*x.shape[:2], room, x.shape[3])], 2) for x in xs]
                        for xs in (keys, values))
        return PrefixCache(keys, values, pad, hidden, room)

    def suffix_out(self, cache: PrefixCache, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The expert's last states of the H action tokens [B, H, expert width], against `cache`."""
        embeds, pad, blocks, cond = self.embed_suffix(state, x_t, t)
        b, s = pad.shape
        mask = torch.cat([cache.pad[:, None, :].expand(b, s, -1), attention_mask_2d(pad, blocks)], dim=2)
        positions = cache.pad.long().sum(-1, keepdim=True) + pad.long().cumsum(-1) - 1
        (_, out), _, _ = self.joint_layers([None, (embeds.to(self._expert_dtype), self._expert)], mask, positions,
                                           cond, cache)
        return out[:, -self.config.action_horizon:]

    def velocity_and_states(self, cache: PrefixCache, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """One denoise step: the velocity [B, H, action_dim] (float32) and the expert's states
        of the action tokens it came from (a value head reads them)."""
        out = self.suffix_out(cache, state, x_t, t)
        return self.action_out_proj(out.to(self.action_out_proj.weight.dtype)).float(), out

    def velocity(self, cache: PrefixCache, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.velocity_and_states(cache, state, x_t, t)[0]

    @property
    def _expert_dtype(self) -> torch.dtype:
        return self._expert.layers[0].self_attn.q_proj.weight.dtype

    # ----- the training loss (sampling: agents/pi0/sampler.py) -----

    def loss(self, inputs: Pi0Inputs, actions: torch.Tensor, noise: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """The flow-matching loss per element [B, H, action_dim], from one joint pass."""
        t = time[:, None, None]
        x_t = t * noise + (1 - t) * actions
        prefix, prefix_pad, prefix_blocks = self.embed_prefix(inputs)
        suffix, suffix_pad, suffix_blocks, cond = self.embed_suffix(inputs.state, x_t, time)
        pad, blocks = torch.cat([prefix_pad, suffix_pad], 1), torch.cat([prefix_blocks, suffix_blocks], 1)
        (_, out), _, _ = self.joint_layers(
            [(prefix, self._paligemma.language_model), (suffix.to(self._expert_dtype), self._expert)],
            attention_mask_2d(pad, blocks), pad.long().cumsum(-1) - 1, cond)
        v = self.action_out_proj(out[:, -self.config.action_horizon:].to(self.action_out_proj.weight.dtype)).float()
        return (noise - actions - v) ** 2


def _adaptive(layer: nn.Module) -> bool:
    return isinstance(layer.input_layernorm, AdaptiveRMSNorm)


def _rope(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, 1, S, head_dim] of the half-split rotation, in float32."""
    inverse = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float()
                              / head_dim)
    angles = positions.float()[..., None] * inverse
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return (x * cos.to(x.dtype)) + (torch.cat([-second, first], dim=-1) * sin.to(x.dtype))


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """[B, heads, Q, d] x [B, kv heads, K, d] -> [B, Q, heads * d] through torch's fused
    kernels: grouped-query (no per-head copy of the keys), openpi's additive mask (finite,
    so a padded query row gets a uniform softmax, never NaN), the softmax accumulated in
    float32 inside the kernel as openpi's eager float32 softmax does."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """openpi's eager attention, the same shapes: keys and values copied per query head, an
    explicit float32 softmax. Kept to measure the fused kernel against (bench/pi0_inference_step.py)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5 + bias
    weights = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    return torch.matmul(weights, v).transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


ATTENTION_KERNELS = {"sdpa": sdpa_attention, "eager": eager_attention}


def resize_with_pad(images: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """openpi's resize-with-pad: aspect kept, bilinear (no antialias), centred, the odd pixel
    of padding at the bottom/right. Float [B, 3, h, w] in [-1, 1] is clamped and padded with
    -1; uint8 [B, h, w, 3] goes through torch's own uint8 bilinear kernel (as openpi's does:
    its rounding differs from a float pass by 1 on a sixth of the pixels) and is padded with 0."""
    channels_last = images.dtype == torch.uint8
    x = images.permute(0, 3, 1, 2) if channels_last else images
    h, w = x.shape[-2:]
    ratio = max(w / width, h / height)
    new_h, new_w = int(h / ratio), int(w / ratio)
    x = F.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=False)
    if not channels_last:
        x = x.clamp(-1, 1)
    top, extra_h = divmod(height - new_h, 2)
    left, extra_w = divmod(width - new_w, 2)
    x = F.pad(x, (left, left + extra_w, top, top + extra_h), value=0 if channels_last else -1.0)
    return x.permute(0, 2, 3, 1) if channels_last else x
