"""Training: the trainer and its queue of unrolls, the state trust region, recording
unrolls, and training over several ranks (data parallel, sharded, the ranks kept in step)."""
