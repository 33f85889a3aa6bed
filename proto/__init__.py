"""The actor-learner wire protocol: generated gRPC code plus tensor and spec codecs."""

# Bumped whenever a change to learner.proto or its meaning breaks old actors.
# 2: action chunks' results and teacher-forcing draws travel as generic per-step extras.
PROTOCOL_VERSION = 2
