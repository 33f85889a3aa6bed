"""An image agent: a small conv torso, then the shared LSTM neck and heads (agents/lstm_core.py).

For tasks read from pixels over several steps (the gym_cards formula tasks show the
formula so far only in the image). Images are [B, H, W, 3] uint8, as envs produce them.
"""

from __future__ import annotations

import torch
from torch import nn

from fleetrl.agents.base import Observation
from fleetrl.agents.lstm_core import LSTMCore
from fleetrl.agents.observation_norm import RunningImageNorm
from fleetrl.common.settings import check_choice

OBSERVATION_NORMS = ("image", "running")


def conv_torso(image_size: int | tuple[int, int], channels: tuple[int, ...] = (32, 64, 64)) -> tuple[nn.Module, int]:
    """Strided convolutions down to a few pixels, then flattened; returns the module and its width.
    `image_size`: the side of square images, or (height, width)."""
    height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
    layers: list[nn.Module] = []
    in_channels = 3
    for out_channels in channels:
        layers += [nn.Conv2d(in_channels, out_channels, kernel_size=4, stride=2, padding=1), nn.ReLU()]
        in_channels = out_channels
    body = nn.Sequential(*layers, nn.Flatten())
    with torch.no_grad():
        features = body(torch.zeros(1, 3, height, width)).shape[1]
    return body, features


class ConvLSTMAgent(LSTMCore):
    def __init__(self, image_size: int | tuple[int, int], num_actions: int, channels: tuple[int, ...] = (32, 64, 64),
                 hidden_size: int = 256, lstm_size: int = 128, image_key: str = "image",
                 observation_norm: str = "image"):
        """`observation_norm`: "image" standardizes each image by its own mean and std;
        "running" standardizes each pixel by the statistics of all training images so far
        (fleetrl.agents.observation_norm), for tasks whose images are nearly the same in
        every state."""
        super().__init__()
        check_choice("observation_norm", observation_norm, OBSERVATION_NORMS)
        self.image_key = image_key
        height_width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.pixel_norm = RunningImageNorm(*height_width) if observation_norm == "running" else None
        self.conv, width = conv_torso(height_width, channels)
        # The LSTM reads layer-normalized features. A ReLU torso can scale its output up freely,
        # and a near-deterministic policy's gradient keeps asking for sharper features; without
        # the norm that growth drove every LSTM gate into saturation (NumberLine's collapse to
        # one action, docs/notes/numberline_dips.md), where no gradient gets through to undo it.
        self.project = nn.Sequential(nn.Linear(width, hidden_size), nn.ReLU(), nn.LayerNorm(hidden_size))
        self.build_core(hidden_size, lstm_size, num_actions, batch_key=image_key)
        _init_weights(self)

    def torso(self, observation: Observation) -> torch.Tensor:
        if self.pixel_norm is not None:
            return self.project(self.conv(self.pixel_norm(observation[self.image_key])))
        image = observation[self.image_key].permute(0, 3, 1, 2).float()
        # Per-image standardization: a flat background (white paper, green felt) becomes 0,
        # so the first convolutions respond to the digits and cards, not to the background.
        mean = image.mean(dim=(1, 2, 3), keepdim=True)
        std = image.std(dim=(1, 2, 3), keepdim=True).clamp(min=1.0)
        image = (image - mean) / std
        return self.project(self.conv(image))

    def update_statistics(self, observation: Observation) -> None:
        if self.pixel_norm is not None:
            self.pixel_norm.update(observation[self.image_key])


def _init_weights(agent: ConvLSTMAgent) -> None:
    """Orthogonal init as in CleanRL's pixel PPO: the tiny policy gain starts every action
    equally likely, which keeps PPO from committing to an action before the torso can see."""
    for module in agent.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.orthogonal_(module.weight, gain=2 ** 0.5)
            nn.init.zeros_(module.bias)
    for name, parameter in agent.core.named_parameters():
        if "weight" in name:
            nn.init.orthogonal_(parameter)
        else:
            nn.init.zeros_(parameter)
    nn.init.orthogonal_(agent.policy.weight, gain=0.01)
    nn.init.orthogonal_(agent.baseline.weight, gain=1.0)
