"""Text actions: an env whose agent answers in text, parsed into the env's own action.

A vision-language agent generates its answer on the learner; the actor receives the answer
as UTF-8 bytes (`text`, zero-padded to a fixed width, with `text_length`) beside the
generated token ids, which only the learner's training reads. `TextActions` wraps a
Discrete-action env whose info lists `legal_actions` as strings, parses each answer with
RL4VLM's rule (`fleetrl.envs.text_to_action`: the one legal action after
`"action":`), and plays it. An answer that names no single legal action plays a uniformly
random legal one, and counts as a parse failure: each step's info says whether it failed,
and the episode's last info carries its rate and the mean answer length. `failure_reward`
is added to a failed step's reward (0, RL4VLM's rule, leaves the reward alone; a negative
one teaches the format where a random action would score as well as the policy's).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.envs.text_to_action import text_to_action

# The action's parts: what the actor reads (text, text_length) and what the learner trains on.
TOKENS, NUM_TOKENS, THOUGHT_TOKENS, TEXT, TEXT_LENGTH = "tokens", "num_tokens", "thought_tokens", "text", "text_length"


def text_action_space(max_new_tokens: int, max_text_bytes: int) -> gym.spaces.Dict:
    return gym.spaces.Dict({
        TOKENS: gym.spaces.Box(0, np.iinfo(np.int32).max, (max_new_tokens,), np.int64),
        NUM_TOKENS: gym.spaces.Box(0, max_new_tokens, (), np.int64),
        THOUGHT_TOKENS: gym.spaces.Box(0, max_new_tokens, (), np.int64),
        TEXT: gym.spaces.Box(0, 255, (max_text_bytes,), np.uint8),
        TEXT_LENGTH: gym.spaces.Box(0, max_text_bytes, (), np.int64),
    })


def decode_text(data: np.ndarray, length: int) -> str:
    return bytes(np.asarray(data, np.uint8)[:max(0, int(length))]).decode("utf-8", errors="replace")


def encode_text(text: str, width: int) -> tuple[np.ndarray, int]:
    """`text` as zero-padded UTF-8 bytes of `width`, cut at a whole character, and its length."""
    data = text.encode("utf-8")[:width]
    data = data.decode("utf-8", errors="ignore").encode("utf-8")
    out = np.zeros(width, np.uint8)
    out[:len(data)] = np.frombuffer(data, np.uint8)
    return out, len(data)


class TextActions(gym.Wrapper):
    def __init__(self, env: gym.Env, max_new_tokens: int, max_text_bytes: int, failure_reward: float = 0.0):
        super().__init__(env)
        self.failure_reward = failure_reward
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise ValueError(f"text actions need a Discrete action space, not {type(env.action_space).__name__}")
        self.action_space = text_action_space(max_new_tokens, max_text_bytes)
        self._legal: list[str] = []
        self._parse = np.random.default_rng()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._parse = np.random.default_rng([seed, 0x7E47])  # the fallback's draws repeat with the seed
        obs, info = self.env.reset(seed=seed, options=options)
        self._legal = list(info["legal_actions"])
        self._steps, self._failures, self._length = 0, 0, 0
        return obs, info

    def step(self, action: dict[str, np.ndarray]):
        text = decode_text(action[TEXT], int(action[TEXT_LENGTH]))
        parsed = text_to_action(text, self._legal, self._parse)
        obs, reward, terminated, truncated, info = self.env.step(parsed.index)
        if parsed.parse_failed:
            reward = float(reward) + self.failure_reward
        self._legal = list(info.get("legal_actions", self._legal))
        self._steps += 1
        self._failures += parsed.parse_failed
        self._length += len(text)
        info = {**info, "parse_failed": parsed.parse_failed, "parse_failure_rate": self._failures / self._steps,
                "answer_length": self._length / self._steps}
        return obs, reward, terminated, truncated, info
