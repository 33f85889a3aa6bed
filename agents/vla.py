"""A small vision-language-action agent for LIBERO-style manipulation.

- `initial_state` reads the task's language once per episode: a frozen sentence embedding
  (`text_encoder="minilm"`, see `sentence_encoder`) or, as the fallback that needs no extra
  package, the raw UTF-8 bytes (`"bytes"`) that a trainable byte embedding reads each step.
- `torso` (over T*B): a conv net per camera (main, wrist) pooled to a grid of image tokens,
  and a state MLP as one more token.
- `neck`: the language, projected, joins as a token and conditions every token (FiLM), then
  a per-token MLP fuses them. Nothing recurs: the state is the language alone.
- `head`: a Gaussian over a chunk of K actions (the mean from attention pooling with a
  language query, a learned per-dimension log-std), and a value head whose pooling over the
  tokens is `value_pooling`: mean, max, or attention with its own query.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fleetrl.agents.base import Agent, AgentOutput, Observation, State
from fleetrl.agents.sentence_encoder import EMBEDDING_SIZE, encode_sentences

TEXT_ENCODERS = ("minilm", "bytes")
VALUE_POOLINGS = ("mean", "max", "attention")


def _camera_torso(channels: tuple[int, ...], grid: int, hidden_size: int) -> nn.Module:
    layers: list[nn.Module] = []
    in_channels = 3
    for out_channels in channels:
        layers += [nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=2, padding=1), nn.ReLU()]
        in_channels = out_channels
    # Pooling to a fixed grid keeps the token count the same for any image size.
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(grid), nn.Conv2d(in_channels, hidden_size, 1))


class AttentionPool(nn.Module):
    """Pools tokens [B, N, H] with one query [B, H] (or a learned one) -> [B, H]."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.query = nn.Parameter(torch.randn(hidden_size) / math.sqrt(hidden_size))
        self.key = nn.Linear(hidden_size, hidden_size)

    def forward(self, tokens: torch.Tensor, query: torch.Tensor | None = None) -> torch.Tensor:
        query = self.query.expand(tokens.shape[0], -1) if query is None else query
        scores = torch.einsum("bh,bnh->bn", query, self.key(tokens)) / math.sqrt(tokens.shape[-1])
        return torch.einsum("bn,bnh->bh", torch.softmax(scores, -1), tokens)


class VLAAgent(Agent):
    def __init__(self, action_size: int = 7, chunk_size: int = 1, state_size: int = 8,
                 channels: tuple[int, ...] = (16, 32, 32), hidden_size: int = 128, grid: int = 4,
                 text_encoder: str = "minilm", value_pooling: str = "mean", initial_log_std: float = -0.5):
        super().__init__()
        if text_encoder not in TEXT_ENCODERS:
            raise ValueError(f"unknown text_encoder {text_encoder!r}; choose from {TEXT_ENCODERS}")
        if value_pooling not in VALUE_POOLINGS:
            raise ValueError(f"unknown value_pooling {value_pooling!r}; choose from {VALUE_POOLINGS}")
        self.text_encoder, self.value_pooling = text_encoder, value_pooling
        self.main_camera = _camera_torso(channels, grid, hidden_size)
        self.wrist_camera = _camera_torso(channels, grid, hidden_size)
        self.state_mlp = nn.Sequential(nn.Linear(state_size, hidden_size), nn.ReLU(),
                                       nn.Linear(hidden_size, hidden_size))
        if text_encoder == "minilm":
            self.language = nn.Linear(EMBEDDING_SIZE, hidden_size)
        else:
            self.byte_embedding = nn.EmbeddingBag(256, hidden_size, mode="mean", padding_idx=0)
            self.language = nn.Linear(hidden_size, hidden_size)
        self.film = nn.Linear(hidden_size, 2 * hidden_size)
        self.fuse = nn.Sequential(nn.LayerNorm(hidden_size), nn.Linear(hidden_size, hidden_size), nn.ReLU())
        self.policy_pool = AttentionPool(hidden_size)
        self.action_mean = nn.Linear(hidden_size, chunk_size * action_size)
        self.log_std = nn.Parameter(torch.full((chunk_size * action_size,), initial_log_std))
        self.value_pool = AttentionPool(hidden_size) if value_pooling == "attention" else None
        self.baseline = nn.Linear(hidden_size, 1)
        # CleanRL's init: the policy starts near the middle of the action range.
        nn.init.orthogonal_(self.action_mean.weight, 0.01)
        nn.init.zeros_(self.action_mean.bias)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)

    def initial_state(self, observation: Observation) -> State:
        data = observation["language"]
        if self.text_encoder == "bytes":
            return data.float()  # the byte embedding is trainable, so it runs in the neck
        texts = [bytes(row).rstrip(b"\0").decode("utf-8", errors="replace")
                 for row in data.to("cpu", torch.uint8).numpy()]
        return encode_sentences(texts, data.device)

    def torso(self, observation: Observation) -> torch.Tensor:
        tokens = [self._camera_tokens(self.main_camera, observation["main_image"]),
                  self._camera_tokens(self.wrist_camera, observation["wrist_image"]),
                  self.state_mlp(observation["state"].float()).unsqueeze(1)]
        return torch.cat(tokens, dim=1)  # [N, 2 * grid^2 + 1, H]

    @staticmethod
    def _camera_tokens(camera: nn.Module, image: torch.Tensor) -> torch.Tensor:
        x = image.permute(0, 3, 1, 2).float() / 127.5 - 1.0
        return camera(x).flatten(2).transpose(1, 2)

    def neck(self, torso_output: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        if self.text_encoder == "bytes":
            language = self.language(self.byte_embedding(state.long()))
        else:
            language = self.language(state)
        tokens = torch.cat([torso_output, language.unsqueeze(1)], dim=1)
        scale, shift = self.film(language).unsqueeze(1).chunk(2, dim=-1)
        tokens = tokens + self.fuse(tokens * (1 + scale) + shift)
        return torch.cat([tokens, language.unsqueeze(1)], dim=1), state  # the last token is the query

    def head(self, neck_output: torch.Tensor) -> AgentOutput:
        tokens, query = neck_output[:, :-1], neck_output[:, -1]
        mean = self.action_mean(self.policy_pool(tokens, query))
        if self.value_pooling == "mean":
            value_features = tokens.mean(1)
        elif self.value_pooling == "max":
            value_features = tokens.amax(1)
        else:
            value_features = self.value_pool(tokens)
        return {"action_mean": mean, "action_log_std": self.log_std.expand_as(mean),
                "baseline": self.baseline(value_features).squeeze(-1)}
