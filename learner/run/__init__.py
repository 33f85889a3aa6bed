"""The run: the training run that composes the rooms below, its state, checkpoints and
saved policies, its files and report, stop conditions, the monitor and summaries."""
