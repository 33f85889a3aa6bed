"""Sampling a chunk of actions from a flow-matching policy, with log-probabilities for RL.

A flow-matching action expert predicts a velocity v(x_t, t) that carries Gaussian noise
(t = 1) to an action chunk (t = 0): training pairs a demonstrated chunk A with noise e at
x_t = t*e + (1-t)*A and regresses v onto e - A (pi0, Black et al. 2024). Inference
integrates K Euler steps over the grid t_k = 1 - k/K, k = 0..K.

A deterministic ODE has no log-probability, so RL makes some steps Gaussian transitions
x_{k+1} ~ N(mean_k, std_k^2) (piRL, Chen et al. 2025, arXiv 2510.25889; RLinf's
`flow_sde` and `flow_noise`). With x0 = x_t - v*t (the action estimate), x1 = x_t + v*(1-t)
(the noise estimate), t = t_k and d = t_k - t_{k+1}:

- ODE:        mean = x_t - d*v (equal to x0*(1-(t-d)) + x1*(t-d)), std = 0 (a step not
              chosen stochastic, and every step in eval);
- flow_sde:   sigma = noise_level * sqrt(t / (1 - t)) (1 - t_1 in the denominator at t = 1),
              mean = x0*(1-(t-d)) + x1*(t - d - sigma^2*d/(2t)), std = sqrt(d)*sigma:
              the SDE with the ODE's marginals, discretized;
- flow_noise: mean as the ODE's, std from the expert's own noise head (bounded by it).

Which steps are stochastic is chosen per sample: one step drawn at random (RLinf's default)
or all of them. The chain of states x_0..x_K (x_0 the start noise, x_K the action) and the
stochastic steps are recorded; `chain_log_prob` recomputes the log-prob of the recorded
transitions under the current weights with the same `transition` and `gaussian_log_prob`
that `sample` used, so acting and training agree. The log-prob is per action and dim
([B, H, D], for fleetrl.losses.chunks), zero where `log_prob_mask` is 0: the padded dims
and the actions of a chunk that are not executed. It reduces the stochastic steps by
`log_prob_reduction`: "sum", the chain's density up to the start noise's term (which no
weight changes), or "mean", RLinf's joint log-prob: the start noise's term and the
stochastic steps' averaged, which divides a log-ratio by their count (so RLinf's clip
values carry over).

Every dim of the chain carries noise, the padded ones too, as openpi's sampler does: a
pretrained expert has read them so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from fleetrl.common.settings import check_choice, check_range, setting

METHODS = ("flow_sde", "flow_noise")
STOCHASTIC_STEPS = ("one", "all")
REDUCTIONS = ("sum", "mean")

# velocity(x [M, H, D], t [M], rows [M]) -> (v [M, H, D], std [M, H, D] or None): the
# expert at M states, `rows` saying which sample of the batch (which prefix) each one is.
# The std is the expert's noise head's (flow_noise); flow_sde computes its own.
Velocity = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


@dataclasses.dataclass(frozen=True)
class FlowSamplerConfig:
    denoise_steps: int = setting(5, "Euler steps from noise to an action chunk (K; RLinf's LIBERO configs use 5).")
    noise_method: str = setting("flow_sde", "How a stochastic denoise step gets its Gaussian: flow_sde (an SDE with "
                                            "the ODE's marginals, std from noise_level) or flow_noise (the expert's "
                                            "learned noise head); docs/flow_vla.md has the formulas.")
    noise_level: float = setting(0.5, "flow_sde's noise scale (RLinf's LIBERO configs: 0.5).")
    stochastic_steps: str = setting("one", "Which denoise steps are stochastic in a sample: one drawn at random per "
                                           "sample (RLinf's default), or all.")
    log_prob_reduction: str = setting("sum", "How a chunk's stochastic steps make its log-prob: sum (the chain's "
                                             "density) or mean (RLinf's joint log-prob: with the start noise's "
                                             "term, averaged; its clip values assume it).")

    def __post_init__(self):
        check_range("denoise_steps", self.denoise_steps, low=1)
        check_choice("noise_method", self.noise_method, METHODS)
        check_choice("stochastic_steps", self.stochastic_steps, STOCHASTIC_STEPS)
        check_choice("log_prob_reduction", self.log_prob_reduction, REDUCTIONS)
        check_range("noise_level", self.noise_level, low=0, low_open=True)


@dataclasses.dataclass
class FlowSample:
    """One sampled chunk per row: `actions` [B, H, D] (the chain's last state), `chain`
    [B, K+1, H, D], `stochastic` [B, K] (bool), `log_prob` [B, H, D] (zero where deterministic)."""

    actions: torch.Tensor
    chain: torch.Tensor
    stochastic: torch.Tensor
    log_prob: torch.Tensor


def timesteps(denoise_steps: int, device: torch.device | None = None) -> torch.Tensor:
    """t_0 = 1 > t_1 > ... > t_K = 0, evenly spaced: [K+1]."""
    return 1 - torch.arange(denoise_steps + 1, device=device, dtype=torch.float32) / denoise_steps


def transition(config: FlowSamplerConfig, x: torch.Tensor, step: torch.Tensor, v: torch.Tensor,
               learned_std: torch.Tensor | None, stochastic: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gaussian (mean, std) of denoise step `step` ([M] ints) from states x [M, H, D] with
    velocity v; where `stochastic` [M] is False, the ODE's step: its mean, std 0."""
    grid = timesteps(config.denoise_steps, x.device)
    t = grid[step].view(-1, 1, 1)
    d = (grid[step] - grid[step + 1]).view(-1, 1, 1)
    live = stochastic.view(-1, 1, 1)
    if config.noise_method == "flow_noise":
        if learned_std is None:
            raise ValueError("noise_method=flow_noise needs an expert with a noise head")
        return x - d * v, learned_std * live
    x0, x1 = x - v * t, x + v * (1 - t)
    # At t = 1, sqrt(t / (1 - t)) is infinite: the next grid point stands in (as RLinf's).
    denominator = torch.where(t == 1, 1 - grid[1], 1 - t)
    sigma = config.noise_level * torch.sqrt(t / denominator) * live
    mean = x0 * (1 - (t - d)) + x1 * (t - d - sigma**2 * d / (2 * t))
    return mean, (torch.sqrt(d) * sigma).expand_as(mean)


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; mean, std^2), 0 where std is 0 (a deterministic entry)."""
    live = std > 0
    safe = torch.where(live, std, torch.ones_like(std))
    log_prob = -torch.log(safe) - 0.5 * math.log(2 * math.pi) - 0.5 * ((x - mean) / safe) ** 2
    return torch.where(live, log_prob, torch.zeros_like(log_prob))


def draw_stochastic_steps(config: FlowSamplerConfig, batch: int, device: torch.device,
                          generator: torch.Generator | None = None) -> torch.Tensor:
    """[B, K] bool: the steps each sample makes stochastic."""
    k = config.denoise_steps
    if config.stochastic_steps == "all":
        return torch.ones(batch, k, dtype=torch.bool, device=device)
    chosen = torch.randint(k, (batch,), device=device, generator=generator)
    return torch.nn.functional.one_hot(chosen, k).bool()


def sample(config: FlowSamplerConfig, velocity: Velocity, noise: torch.Tensor, log_prob_mask: torch.Tensor,
           deterministic: bool = False, generator: torch.Generator | None = None) -> FlowSample:
    """Denoises `noise` [B, H, D] in K steps. `log_prob_mask` ([H, D] or [D]) is 1 where an
    entry counts in the log-prob. Deterministic: the ODE, every step (eval's default)."""
    batch, k = noise.shape[0], config.denoise_steps
    rows = torch.arange(batch, device=noise.device)
    stochastic = (torch.zeros(batch, k, dtype=torch.bool, device=noise.device) if deterministic
                  else draw_stochastic_steps(config, batch, noise.device, generator))
    x = noise
    chain, log_prob = [x], torch.zeros_like(x)
    for step in range(k):
        steps = torch.full((batch,), step, device=noise.device)
        v, learned_std = velocity(x, timesteps(k, noise.device)[steps], rows)
        mean, std = transition(config, x, steps, v, learned_std, stochastic[:, step])
        x = mean + std * torch.randn(mean.shape, device=mean.device, generator=generator)
        log_prob = log_prob + gaussian_log_prob(x, mean, std)
        chain.append(x)
    chain = torch.stack(chain, dim=1)
    return FlowSample(actions=x, chain=chain, stochastic=stochastic,
                      log_prob=_reduced(config, log_prob, chain, stochastic) * log_prob_mask)


def chain_log_prob(config: FlowSamplerConfig, velocity: Velocity, chain: torch.Tensor, stochastic: torch.Tensor,
                   log_prob_mask: torch.Tensor) -> torch.Tensor:
    """[B, H, D]: the log-prob of the recorded chains' stochastic transitions under `velocity`
    (the current weights). The expert runs once, batched over every stochastic (sample, step)."""
    rows, steps = stochastic.nonzero(as_tuple=True)
    if rows.numel() == 0:  # no stochastic step (chains the ODE made): nothing to score
        return torch.zeros_like(chain[:, 0])
    x, x_next = chain[rows, steps], chain[rows, steps + 1]
    v, learned_std = velocity(x, timesteps(config.denoise_steps, chain.device)[steps], rows)
    mean, std = transition(config, x, steps, v, learned_std, torch.ones_like(rows, dtype=torch.bool))
    summed = torch.zeros_like(chain[:, 0]).index_add(0, rows, gaussian_log_prob(x_next, mean, std))
    return _reduced(config, summed, chain, stochastic) * log_prob_mask


def _reduced(config: FlowSamplerConfig, summed: torch.Tensor, chain: torch.Tensor,
             stochastic: torch.Tensor) -> torch.Tensor:
    """The stochastic steps' summed log-probs [B, H, D], reduced as the config says."""
    if config.log_prob_reduction == "sum":
        return summed
    start = gaussian_log_prob(chain[:, 0], torch.zeros_like(chain[:, 0]), torch.ones_like(chain[:, 0]))
    return (start + summed) / (1 + stochastic.sum(1)).view(-1, 1, 1)
