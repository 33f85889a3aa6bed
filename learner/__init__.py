"""The learner: gRPC server, inference batching, per-env state, unroll assembly, training."""
