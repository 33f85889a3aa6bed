"""Evaluation during training: the rounds that hand eval episodes to eval actors, and the
deterministic inference on a snapshot of the policy that plays them."""
