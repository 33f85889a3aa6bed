"""Agents: VALAN-style torso / neck / head models that serve inference and training alike."""

from fleetrl.agents.base import Agent, AgentOutput, State
from fleetrl.agents.conv_lstm import ConvLSTMAgent
from fleetrl.agents.lstm import LSTMAgent
from fleetrl.agents.mlp import GaussianMLPAgent, MLPAgent
from fleetrl.agents.vla import VLAAgent
from fleetrl.agents.vln import VLNAgent

__all__ = ["Agent", "AgentOutput", "State", "ConvLSTMAgent", "GaussianMLPAgent", "LSTMAgent", "MLPAgent", "VLAAgent",
           "VLNAgent"]
