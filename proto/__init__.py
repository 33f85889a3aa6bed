"""The actor-learner wire protocol: generated gRPC code plus tensor and spec codecs."""
