"""LIBERO robot manipulation: suites, reset states, and the simulator as a Gymnasium env."""
