"""What a VLM's batched generation keeps of itself for RL: each chosen token's log-prob and
the prompt's last hidden state, and nothing else.

`transformers`' `generate(output_logits=True, output_hidden_states=True)` keeps every
step's full-vocabulary logits ([B, V] a token: gigabytes over an answer at a 7B model's
vocabulary, before a float32 log-softmax over all of them) and every layer's hidden
states of every step, where RL reads one log-prob a token and one vector a sample.

- `ChosenTokenLogProbs`, a logits processor: at each step it scores the distribution the
  policy samples from (`log_probs`, the agent's own function, so acting and training stay
  one formula), and gathers the previous step's chosen token, which generation has just
  appended to `input_ids`; only one step's [B, V] is held at a time. `finish` gathers the
  last token's.
- `PromptState`, a forward hook on the decoder's final norm: its first call in a
  generation is the prefill over the whole prompt, whose last position is the state the
  value head reads (the last layer's, as `hidden_states[-1]` gives it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fleetrl.agents.hf.pretrained_base import import_transformers


def chosen_token_log_probs(log_probs: Callable[[torch.Tensor], torch.Tensor]):
    """A fresh `ChosenTokenLogProbs` (a transformers LogitsProcessor) for one generation."""
    processor_base = import_transformers("VLM generation").LogitsProcessor

    class ChosenTokenLogProbs(processor_base):
        def __init__(self):
            self.values: list[torch.Tensor] = []
            self._previous: torch.Tensor | None = None

        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            if self._previous is not None:
                self.values.append(self._previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
            self._previous = log_probs(scores)
            return scores

        def finish(self, tokens: torch.Tensor) -> torch.Tensor:
            """[B, n]: the log-prob of each of the n generated `tokens` ([B, n])."""
            if self._previous is not None and len(self.values) < tokens.shape[1]:
                self.values.append(self._previous.gather(-1, tokens[:, -1:]).squeeze(-1))
                self._previous = None
            if len(self.values) != tokens.shape[1]:
                raise RuntimeError(f"the generation scored {len(self.values)} steps for {tokens.shape[1]} tokens")
            return torch.stack(self.values, dim=1) if self.values else torch.zeros(tokens.shape, device=tokens.device)

    return ChosenTokenLogProbs()


class PromptState:
    """The prompt's last hidden state from a generation's prefill, hooked on `norm` (the
    decoder's final norm). Use as a context manager around one `generate` call."""

    def __init__(self, norm: nn.Module):
        self.norm, self.state = norm, None
        self._handle = None

    def _hook(self, module: nn.Module, inputs, output: torch.Tensor) -> None:
        if self.state is None:  # the prefill; later calls are the new tokens one at a time
            self.state = output[:, -1]

    def __enter__(self) -> PromptState:
        self._handle = self.norm.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()


def final_norm(model: nn.Module) -> nn.Module | None:
    """The decoder's final norm of a transformers VLM (Llama, Mistral, Qwen2 and Gemma decoders
    name it `norm`), or None for a decoder that has none by that name."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    norm = getattr(decoder, "norm", None)
    return norm if isinstance(norm, nn.Module) else None
