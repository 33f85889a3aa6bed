"""pi0 and pi0.5 as openpi computes them: the model, its checkpoints (openpi, LeRobot, RLinf),
normalization, prompts, the flow sampler with its log-probs, the flow-VLA agent, and a tiny
random build."""
