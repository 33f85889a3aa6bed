"""Vision-language models that think, then answer in text (RL4VLM): the agent, its generation
records and token offsets, and a tiny random build."""
