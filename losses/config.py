"""Every loss setting, in one flat dataclass that each Problem's config extends.

Flat, so that any of them can be set with --hparams (for example
`--hparams=algorithm=ppo,clip_eps_high=0.28,epochs=4`) or as a flag of its own
(`--clip_eps_high=0.28`). Each algorithm reads the fields it documents; a built-in one refuses, at
start and by name, a value other than the default for a field that only other algorithms
read (`fleetrl.losses.algorithms.ALGORITHM_SETTINGS`).
"""

from __future__ import annotations

import dataclasses

from fleetrl.common.settings import check_choice, check_range, setting

REWARD_TYPES = ("chunk_level", "action_level")
LOGPROB_TYPES = ("chunk_level", "action_level", "token_level")


@dataclasses.dataclass
class LossConfig:
    # Checked against the registry (fleetrl.losses.algorithms.ALGORITHMS) by ProblemConfig, so
    # that this module, which the algorithms import, imports none of them.
    algorithm: str = setting("vtrace", "The training algorithm, by registered name: vtrace, ppo, grpo, supervised "
                                       "(fleetrl.losses.algorithms.ALGORITHMS).")
    discount: float = setting(0.99, "Gamma, per agent step.")
    reward_scale: float = setting(1.0, "Rewards are multiplied by this in the loss (episode returns are reported "
                                       "unscaled): it sets the size of values and advantages beside the entropy "
                                       "bonus.")
    entropy_cost: float = setting(0.01, "Weight of the entropy bonus.")
    baseline_cost: float = setting(0.5, "Weight of the value loss (V-trace's baseline cost, PPO's c_v).")

    # V-trace (Espeholt et al. 2018).
    rho_bar: float = setting(1.0, "V-trace: clipping of the importance weights in the value targets.")
    c_bar: float = setting(1.0, "V-trace: clipping of the trace-cutting coefficients.")
    pg_rho_bar: float = setting(1.0, "V-trace: clipping of the importance weights in the policy gradient.")
    lambda_: float = setting(1.0, "V-trace: the lambda of the traces.")

    # PPO (Schulman et al. 2017) and GAE (Schulman et al. 2016).
    gae_lambda: float = setting(0.95, "GAE's lambda.")
    clip_eps_low: float = setting(0.2, "PPO: the ratio is clipped below at 1 - clip_eps_low...")
    clip_eps_high: float = setting(0.2, "...and above at 1 + clip_eps_high.")
    dual_clip: float | None = setting(None, "PPO: above 1, caps the loss of negative-advantage steps whose ratio "
                                            "exploded (Ye et al. 2020); none: off.")
    value_clip_eps: float | None = setting(None, "PPO: clip the value's change per update to this; none: off.")
    value_huber_delta: float | None = setting(None, "The Huber loss with this delta for the value; none: squared "
                                                    "error.")
    normalize_advantages: bool = setting(True, "PPO: normalize advantages over each minibatch's valid steps.")
    target_kl: float | None = setting(
        None, "PPO: a batch's remaining epochs and minibatches are skipped once a minibatch's approx KL from the "
              "policy that acted exceeds 1.5 x this (as SB3 and CleanRL do); none: off.")
    anchor_kl_cost: float = setting(
        0.0, "PPO: weight of KL(before || now) on each sampled state's whole action distribution, where before is "
             "the policy at the start of the batch's updates (categorical policy_logits only; 0: off). PPO's clip "
             "only removes the incentive to move a state further; this pulls back a state that drifts while its "
             "advantages are near 0.")
    max_state_kl: float | None = setting(
        None, "PPO: after each optimizer step, KL(before || now) on every state of the batch, before being the "
              "policy at the start of the batch's updates; a step that takes any state past this is shortened by "
              "halves until none is, and ends the batch's updates (fleetrl.learner.training.state_trust_region; "
              "categorical policy_logits only). None: off.")

    # Action chunks (fleetrl.losses.chunks).
    reward_type: str = setting("chunk_level", "With action chunks: chunk_level trains on one reward per step (the "
                                              "chunk's sum), action_level on each action's (PPO only).")
    logprob_type: str = setting("chunk_level", "With action chunks: one ratio per chunk (chunk_level), per action "
                                               "(action_level) or per token (token_level; PPO and GRPO).")

    group_size: int = setting(1, "GRPO: envs per group. A group's members start each episode from the same reset "
                                 "seed, and each episode's advantage is its return normalized within the group.")
    max_waiting_unrolls: int = setting(4096, "GRPO: unrolls waiting for their group's episodes to end, at most "
                                             "(the learner's memory bound beside the unroll queue's). Past it, "
                                             "the oldest waiting group's unrolls are dropped, with a log line: a "
                                             "member lags far behind, or has stalled.")

    epochs: int | None = setting(None, "Passes over each batch of unrolls; none: the algorithm's default "
                                       "(V-trace and GRPO 1, PPO 4).")
    minibatches: int | None = setting(None, "Minibatches per epoch, split across whole unrolls (so recurrent "
                                            "agents keep them whole); none: the algorithm's default (1, PPO 4).")
    accumulation_steps: int = setting(1, "Splits each minibatch into this many microbatches whose gradients add "
                                         "up to one optimizer step: about the same update in less memory (each "
                                         "microbatch averages its own loss and normalizes its own advantages).")

    def __post_init__(self):
        check_choice("reward_type", self.reward_type, REWARD_TYPES)
        check_choice("logprob_type", self.logprob_type, LOGPROB_TYPES)
        check_range("discount", self.discount, low=0, high=1)
        check_range("reward_scale", self.reward_scale, low=0, low_open=True)
        for name in ("gae_lambda", "lambda_"):
            check_range(name, getattr(self, name), low=0, high=1)
        check_range("target_kl", self.target_kl, low=0, low_open=True)
        check_range("anchor_kl_cost", self.anchor_kl_cost, low=0)
        check_range("max_state_kl", self.max_state_kl, low=0, low_open=True)
        for name, on in (("anchor_kl_cost", self.anchor_kl_cost), ("max_state_kl", self.max_state_kl is not None)):
            if on and self.algorithm != "ppo":
                raise ValueError(f"{name} applies to algorithm=ppo only, got algorithm={self.algorithm}")
        for name in ("clip_eps_low", "clip_eps_high"):
            check_range(name, getattr(self, name), low=0)
        check_range("dual_clip", self.dual_clip, low=1, low_open=True)
        for name in ("group_size", "epochs", "minibatches", "accumulation_steps", "max_waiting_unrolls"):
            check_range(name, getattr(self, name), low=1)
        # Cooperative: a config that also extends an agent's settings (FlowVLAConfig does)
        # runs that class's checks next.
        after = getattr(super(), "__post_init__", None)
        if after is not None:
            after()
