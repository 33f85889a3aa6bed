"""Actors: CPU processes that step a batch of envs and stream them to the learner. No model."""
