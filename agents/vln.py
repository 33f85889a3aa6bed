"""A VALAN-style vision-and-language navigation agent.

- `initial_state` encodes the instruction once per episode (embedding + LSTM) and keeps the
  per-token encodings in the recurrent state, next to the LSTM's (h, c).
- `torso` projects the panoramic views and the candidate rows (features + angles), over [T*B].
- `neck` is one LSTM step: the previous h attends over the views and over the instruction,
  the two contexts feed the LSTM, and the new h attends over the instruction again.
- `head` scores each candidate slot against [h, instruction context]; invalid slots are
  masked out, so sampling never picks them. The value reads the same features.
"""

from __future__ import annotations

import torch
from torch import nn

from fleetrl.agents.base import Agent, AgentOutput, Observation, State


def attend(query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Dot-product attention: query [B, H] over keys [B, N, H] -> [B, H]."""
    scores = torch.einsum("bh,bnh->bn", query, keys) / keys.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("bn,bnh->bh", torch.softmax(scores, dim=-1), keys)


class VLNAgent(Agent):
    def __init__(self, vocab_size: int, feature_dim: int, hidden_size: int = 128, embedding_size: int = 64,
                 pad_id: int = 0):
        super().__init__()
        self.pad_id = pad_id
        self.embedding = nn.Embedding(vocab_size, embedding_size, padding_idx=pad_id)
        self.text_encoder = nn.LSTM(embedding_size, hidden_size, batch_first=True)
        self.views = nn.Sequential(nn.Linear(feature_dim, hidden_size), nn.ReLU())
        self.candidates = nn.Linear(feature_dim + 4, hidden_size)
        self.stop = nn.Parameter(torch.zeros(hidden_size))  # what the STOP slot looks like
        self.core = nn.LSTMCell(2 * hidden_size, hidden_size)
        self.view_query = nn.Linear(hidden_size, hidden_size)
        self.text_query = nn.Linear(hidden_size, hidden_size)
        self.scorer = nn.Linear(2 * hidden_size, hidden_size)
        self.baseline = nn.Linear(2 * hidden_size, 1)

    def initial_state(self, observation: Observation) -> State:
        tokens = observation["instruction"].long()
        mask = tokens != self.pad_id
        mask[:, 0] = True  # an empty instruction still has something to attend to
        text, _ = self.text_encoder(self.embedding(tokens))
        zeros = torch.zeros(tokens.shape[0], self.core.hidden_size, device=tokens.device)
        return (zeros, zeros.clone(), text, mask)

    def torso(self, observation: Observation) -> dict[str, torch.Tensor]:
        candidates = self.candidates(torch.cat([observation["candidates"], observation["candidate_angles"]], -1))
        is_stop = torch.zeros_like(candidates[..., :1])
        is_stop[:, 0] = 1.0
        return {"views": self.views(observation["pano"]), "candidates": candidates + is_stop * self.stop,
                "mask": observation["candidate_mask"].bool()}

    def neck(self, torso_output: dict[str, torch.Tensor], state: State) -> tuple[dict[str, torch.Tensor], State]:
        h, c, text, text_mask = state
        seen = attend(self.view_query(h), torso_output["views"])
        read = attend(self.text_query(h), text, text_mask)
        h, c = self.core(torch.cat([seen, read], -1), (h, c))
        features = torch.cat([h, attend(self.text_query(h), text, text_mask)], -1)
        return {"features": features, "candidates": torso_output["candidates"], "mask": torso_output["mask"]}, \
            (h, c, text, text_mask)

    def head(self, neck_output: dict[str, torch.Tensor]) -> AgentOutput:
        query = self.scorer(neck_output["features"])
        logits = torch.einsum("bh,bch->bc", query, neck_output["candidates"]) / query.shape[-1] ** 0.5
        logits = logits.masked_fill(~neck_output["mask"], -1e9)
        return {"policy_logits": logits, "baseline": self.baseline(neck_output["features"]).squeeze(-1)}
