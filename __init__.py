"""fleetrl: SEED RL-style distributed reinforcement learning in PyTorch.

Actors step simulators on CPUs and stream observations over gRPC; one learner owns the
model, batches inference for every actor and trains on the unrolls it assembles.
"""

__version__ = "0.1.0"
