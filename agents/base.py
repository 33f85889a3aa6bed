"""The Agent API, after VALAN's `base_agent.py`.

An agent is split into four parts so that one code path serves both inference (T=1, one
step of many envs) and training (an unroll of T steps of B envs):

- `initial_state(observation)`: the recurrent state at the start of an episode, computed
  from that episode's first observation (for example, an encoded instruction).
- `torso(observation)`: per-step features, run batched over all T*B steps at once.
- `neck(torso_output, state)`: the recurrent core, run one time step at a time.
- `head(neck_output)`: outputs (policy logits, baseline, ...), batched over T*B.

`unroll` resets the state through `initial_state` wherever `first` is set, that is at the
first step of every episode. `step` is `unroll` with T=1, so inference and training cannot
drift apart.

Observations are dicts of tensors. State is any pytree (tuples, lists, dicts) of tensors
whose first dimension is the batch; a stateless agent uses the empty tuple.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

Observation = dict[str, torch.Tensor]
AgentOutput = dict[str, torch.Tensor]
State = Any


class Agent(nn.Module):
    """Base class: subclasses implement the four parts; `unroll` and `step` are shared."""

    def initial_state(self, observation: Observation) -> State:
        """The state for episodes starting at `observation` ([B, ...] tensors)."""
        return ()

    def torso(self, observation: Observation) -> Any:
        """Features of a batch of observations ([N, ...] tensors, N = T*B)."""
        raise NotImplementedError

    def neck(self, torso_output: Any, state: State) -> tuple[Any, State]:
        """One recurrent step over [B, ...] inputs. The default passes the torso through."""
        return torso_output, state

    def head(self, neck_output: Any) -> AgentOutput:
        """Outputs for a batch of neck outputs ([N, ...]), for example policy_logits and baseline."""
        raise NotImplementedError

    def unroll(self, observation: Observation, first: torch.Tensor, state: State,
               actions: dict[str, torch.Tensor] | None = None) -> tuple[AgentOutput, State]:
        """Runs T steps of B envs: observation tensors [T, B, ...], first [T, B] (bool).

        `state` is the state before step 0. Returns outputs shaped [T, B, ...] and the
        state after the last step. In training, `actions` are the actions the steps took
        ([T, B, ...]): an agent whose outputs depend on them (one that scores generated
        text) reads them; the others ignore them.
        """
        num_steps, batch = first.shape
        flat_obs = pytree.tree_map(lambda x: x.reshape(num_steps * batch, *x.shape[2:]), observation)
        flat_torso_out = self.torso(flat_obs)
        if type(self).neck is Agent.neck and not pytree.tree_leaves(state):
            # No recurrence: the step-by-step loop would pass the torso through unchanged.
            neck_out = flat_torso_out
        else:
            torso_out = pytree.tree_map(lambda x: x.reshape(num_steps, batch, *x.shape[1:]), flat_torso_out)
            neck_outs = []
            for t in range(num_steps):
                state = self._reset_where_first(state, first[t], observation, t)
                out, state = self.neck(pytree.tree_map(lambda x: x[t], torso_out), state)
                neck_outs.append(out)
            neck_out = pytree.tree_map(lambda *xs: torch.cat(xs, dim=0), *neck_outs)
        head_out = self.head(neck_out)
        return {k: v.reshape(num_steps, batch, *v.shape[1:]) for k, v in head_out.items()}, state

    def check_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Raises ValueError, saying why, if saved weights must not load into this agent for a
        reason their names and shapes do not show (a VLM's adapters trained on another base
        model, say). Checkpoint loading calls it first."""

    def inference_metrics(self) -> dict[str, float]:
        """Figures about inference since the last call, for TensorBoard (a generating agent's
        tokens/s, say); the learner drains them with each summary write."""
        return {}

    def update_statistics(self, observation: Observation) -> None:
        """Updates input statistics the agent keeps (a running observation normalizer's) from
        a training batch's observations ([T+1, B, ...] tensors). The trainer calls it once per
        batch, under the policy lock, before the batch's updates; the default keeps none."""

    def step(self, observation: Observation, first: torch.Tensor, state: State) -> tuple[AgentOutput, State]:
        """One inference step of B envs: `unroll` with T=1."""
        obs = pytree.tree_map(lambda x: x.unsqueeze(0), observation)
        out, state = self.unroll(obs, first.unsqueeze(0), state)
        return {k: v.squeeze(0) for k, v in out.items()}, state

    def _reset_where_first(self, state: State, first: torch.Tensor, observation: Observation, t: int) -> State:
        """Replaces the state of the envs that start an episode at step t ([T, B] observation)."""
        # initial_state may be expensive (an instruction encoder), so it runs only on the
        # envs that start an episode, and only when one does.
        if not pytree.tree_leaves(state) or not bool(first.any()):
            return state
        index = first.nonzero(as_tuple=True)[0]
        fresh = self.initial_state(pytree.tree_map(lambda x: x[t, index], observation))
        return pytree.tree_map(lambda s, f: s.index_copy(0, index, f.to(s.dtype)), state, fresh)
