"""Inference for the fleet: the batcher that gathers actors' steps, the step that runs the
model on them, each env's recurrent state and partial unroll, and the copies to the device."""
