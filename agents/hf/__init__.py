"""Hugging Face models as agents' parts: loading a pretrained base from a local folder, LoRA
adapters, and tiny random builds from configs for tests and CPU runs."""
