"""The learner's configuration, built once at the entry point and passed down."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class LearnerConfig:
    problem: str = "cartpole"
    # The Problem's own config overrides, key=value (see fleetrl.problems.hparams).
    hparams: dict[str, str] = dataclasses.field(default_factory=dict)
    logdir: str = "runs/default"
    # host:port, or unix:/path. The default serves this machine only.
    bind: str = "127.0.0.1:8686"
    unroll_length: int = 20
    # Small batches mean more updates per env step; raise it with the fleet's size.
    batch_size: int = 8
    # Envs per forward pass; a batch flushes at this size or after the timeout.
    inference_batch_size: int = 64
    inference_timeout_ms: float = 5.0
    # Finished unrolls waiting for the trainer. Bounds memory and policy lag.
    unroll_queue_size: int = 64
    # 0 means no limit.
    total_env_steps: int = 0
    # Stop once the mean return of the last `return_window` episodes reaches this.
    target_mean_return: float | None = None
    return_window: int = 100
    # Hold inference while the trainer updates (SEED RL's block_inference_on_training):
    # with it, PPO trains on data at most one update behind.
    block_inference_on_training: bool = False
    summary_interval_s: float = 5.0
    # Threads for torch ops in each of the inference and training threads. One is fastest
    # for small models on small machines; raise it for big models on many cores.
    torch_threads: int = 1
    # Concurrent actor streams served (one gRPC worker thread each).
    max_actors: int = 64
    # A handshake asking for more envs is refused: each env holds a partial unroll.
    max_envs_per_actor: int = 1024
    # Largest message accepted; a larger one is rejected with INVALID_ARGUMENT, up to the
    # transport's hard cap of 4x this (beyond it gRPC answers RESOURCE_EXHAUSTED).
    max_message_mb: int = 64
    device: str = "cpu"
    seed: int = 0

    # Evaluation: eval actors (actor --mode=eval) play the Problem's eval set once per
    # round, with the weights frozen at the round's start; a round starts at most this often.
    eval_interval_s: float = 30.0
    # Checkpoints in <logdir>/checkpoints: every checkpoint_interval_s seconds and/or every
    # checkpoint_every_steps trainer steps (0: off), and at the end of the run. A restart
    # on the same logdir resumes from the latest.
    checkpoint_interval_s: float = 300.0
    checkpoint_every_steps: int = 0
    keep_checkpoints: int = 3
    # best.pt holds the eval round with the best mean of this episode metric.
    best_metric: str = "return"
    best_mode: str = "max"  # or "min"
    # Warm start: the weights (only) of this checkpoint, into a new run.
    init_checkpoint: str = ""

    # Security (see fleetrl.learner.security). A shared token, read from this file or from
    # $FLEETRL_AUTH_TOKEN: calls without it get UNAUTHENTICATED.
    auth_token_file: str = ""
    # TLS: the server's certificate and key (PEM); with a client CA, mutual TLS.
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    # A stream that sends no handshake within this long is cancelled.
    handshake_timeout_s: float = 10.0
