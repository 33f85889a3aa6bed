"""Problems whose agent is a vision-language model that answers in text (RL4VLM).

`VLMProblem` holds what every such Problem shares: the model and how it trains (LoRA or
full fine-tuning, which parts train), generation (`max_new_tokens`, `temperature`,
`top_p`), the prompt (the Problem's own, or `--prompt` / `--prompt_file`), and the policy's
log-prob of an answer,

    log pi(answer) = thought_lambda * sum(log p(thought tokens)) + sum(log p(action tokens)),

where the thought tokens are those up to the end of the answer's `"action":` marker (all of
them when there is none). RL4VLM found lambda from 0.2 to 0.5 best; 0.1 and 0.7 failed.
Teacher forcing (and the warm start it makes with `algorithm=supervised`) trains on the
oracle's whole answer with every token at full weight.

A subclass gives the env (`make_text_env`: a Discrete-action env whose info lists
`legal_actions`), the prompt (`PROMPT`), and `corpus()`: text the tiny model's tokenizer
is trained on when `model_path=tiny`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import gymnasium as gym
import torch

from fleetrl.agents.base import AgentOutput, Observation, State
from fleetrl.agents.vlm.agent_config import VLMAgentConfig
from fleetrl.agents.vlm.tiny import build_tiny_vlm
from fleetrl.agents.vlm.vlm_agent import VLMAgent
from fleetrl.common.settings import check_range, setting
from fleetrl.envs.teacher_forcing import TEACHER_FORCING
from fleetrl.envs.text_actions import NUM_TOKENS, TEXT, TEXT_LENGTH, THOUGHT_TOKENS, TOKENS, TextActions
from fleetrl.problems.action_policy import ActionPolicy
from fleetrl.problems.base import Problem, ProblemConfig
from fleetrl.problems.defaults import LaunchDefaults, LearnerDefaults

ANSWER = (TOKENS, NUM_TOKENS, THOUGHT_TOKENS, TEXT, TEXT_LENGTH)


@dataclasses.dataclass
class VLMConfig(ProblemConfig, VLMAgentConfig):
    """The VLM Problems' settings: the agent's (agents/vlm/agent_config.py, each one a flag
    too), the prompt, the reward's and the training's."""

    prompt: str = setting("", "The prompt; empty: --prompt_file's, else the Problem's own.")
    prompt_file: str = setting("", "A file whose text is the prompt.")
    parse_failure_reward: float = setting(0.0, "Added to the reward of a step whose answer names no single legal "
                                               "action (which then plays a random one); 0 is RL4VLM's rule.")
    thought_lambda: float = setting(0.5, "The weight of the thought tokens' log-probs in the policy's log-prob.")
    algorithm: str = "ppo"
    discount: float = 0.9  # RL4VLM's
    learning_rate: float = 1e-4
    max_grad_norm: float = 1.0
    entropy_cost: float = 0.0
    epochs: int | None = 1
    minibatches: int | None = 1

    def __post_init__(self):
        super().__post_init__()  # ProblemConfig's checks, then VLMAgentConfig's
        check_range("thought_lambda", self.thought_lambda, low=0, high=1)


class VLMProblem(Problem):
    Config = VLMConfig
    PROMPT: ClassVar[str] = ""
    # Generation serves the whole fleet at once; PPO waits for it.
    learner_defaults = LearnerDefaults(block_inference_on_training=True, batch_size=16, unroll_length=8)
    launch_defaults = LaunchDefaults(num_actors=2, envs_per_actor=8, eval_envs_per_actor=8)

    def make_text_env(self) -> gym.Env:
        """The env whose action the answer names (Discrete, with info["legal_actions"])."""
        raise NotImplementedError

    def corpus(self) -> list[str]:
        """Text like the prompts and answers, for the tiny model's tokenizer."""
        return [self.prompt()]

    def make_env(self) -> gym.Env:
        c = self.config
        return TextActions(self.make_text_env(), c.max_new_tokens, c.max_text_bytes, c.parse_failure_reward)

    def prompt(self) -> str:
        if self.config.prompt:
            return self.config.prompt
        if self.config.prompt_file:
            try:
                with open(self.config.prompt_file) as f:
                    return f.read().strip()
            except OSError as e:
                raise ValueError(f"--prompt_file={self.config.prompt_file}: {e.strerror}") from None
        return self.PROMPT

    def model_path(self) -> str:
        return build_tiny_vlm(self.corpus()) if self.config.model_path == "tiny" else self.config.model_path

    def make_agent(self) -> VLMAgent:
        return VLMAgent(dataclasses.replace(self.config, model_path=self.model_path()), self.prompt())

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        trainable = [p for p in params if p.requires_grad]  # the frozen base model has no optimizer state
        return torch.optim.Adam(trainable, lr=self.config.learning_rate, eps=self.config.adam_eps,
                                betas=self.config.adam_betas(), foreach=True)

    # ----- the policy over answers -----

    def agent_step(self, agent: VLMAgent, observation: Observation, first: torch.Tensor, state: State,
                   extras: Mapping[str, torch.Tensor]) -> tuple[AgentOutput, State]:
        """Teacher-forced episodes play the oracle's answer: nothing is generated for them
        (their rows get the prompt's value and an empty answer; the RL loss masks them)."""
        return agent.step(observation, first, state, answered=extras.get(TEACHER_FORCING))

    def action_policy(self) -> ActionPolicy:
        return AnswerPolicy(self.config, self.action_space(), problem=self)

    def episode_metrics(self, final_info: Mapping[str, Any]) -> dict[str, float]:
        return {"parse_failure_rate": float(final_info["parse_failure_rate"]),
                "answer_length": float(final_info["answer_length"])}

    def episode_metric_names(self) -> tuple[str, ...]:
        return ("parse_failure_rate", "answer_length")


class AnswerPolicy(ActionPolicy):
    """The policy over generated answers: a thought, then an action, as text tokens. Its
    log-prob scales the thought's tokens by `thought_lambda` (RL4VLM's)."""

    def select_actor_action(self, agent_output: AgentOutput, observation: Observation,
                            extras: Mapping[str, torch.Tensor], deterministic: bool = False) -> dict[str, torch.Tensor]:
        """The generated answer (sampled, or greedy when the agent is in eval mode); in a
        teacher-forced episode, the oracle's answer."""
        actions = {k: agent_output[k] for k in ANSWER}
        forced = extras.get(TEACHER_FORCING)
        if forced is not None and bool(forced.any()):
            for k in ANSWER:
                oracle = agent_output[f"oracle_{k}"]
                actions[k] = torch.where(forced.reshape(-1, *[1] * (oracle.dim() - 1)), oracle, actions[k])
        return actions

    def action_log_prob(self, agent_output: AgentOutput, actions: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """thought_lambda * sum(log p(thought tokens)) + sum(log p(action tokens))."""
        logprobs, mask = agent_output["token_logprobs"], agent_output["token_mask"]
        position = torch.arange(logprobs.shape[-1], device=logprobs.device)
        thought = position < actions[THOUGHT_TOKENS].unsqueeze(-1)
        weight = torch.where(thought, torch.full_like(logprobs, self.config.thought_lambda), torch.ones_like(logprobs))
        return (logprobs * weight * mask).sum(-1)

    def teacher_forcing_log_prob(self, agent_output: AgentOutput, actions: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The oracle's whole answer, every token at full weight."""
        return (agent_output["token_logprobs"] * agent_output["token_mask"]).sum(-1)

    def entropy(self, agent_output: AgentOutput) -> torch.Tensor:
        """The mean per-token entropy of the answer."""
        mask = agent_output["token_mask"]
        return (agent_output["token_entropy"] * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def sample_answers(make_env, solve, episodes: int, seed: int = 0) -> list[str]:
    """The solver's answers along episodes played by random actions: tokenizer corpus."""
    import numpy as np

    rng = np.random.default_rng(seed)
    env = make_env()
    answers: list[str] = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        for _ in range(6):
            answers.append(solve(env.unwrapped).text())
            _, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            if terminated or truncated:
                break
    env.close()
    return answers


__all__: Sequence[str] = ("VLMConfig", "VLMProblem", "sample_answers")
