"""The actor's configuration, built once at the entry point and passed down."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ActorConfig:
    learner_address: str = "127.0.0.1:8686"
    # None: ask the learner which Problem (and hparams) it serves.
    problem: str | None = None
    hparams: dict[str, str] = dataclasses.field(default_factory=dict)
    # "train" sends experience to the trainer; "eval" plays the learner's eval rounds
    # deterministically and sends only episode metrics (see fleetrl.learner.eval_rounds).
    mode: str = "train"
    num_envs: int = 32
    # Unique per connected actor; empty means hostname:pid.
    actor_id: str = ""
    seed: int = 0
    # Step envs in subprocesses; worth it only for heavy simulators.
    async_envs: bool = False
    # How long to keep trying to (re)connect before giving up with a non-zero exit.
    max_reconnect_s: float = 60.0
    max_message_mb: int = 64
    # Security: the shared token (this file, or $FLEETRL_AUTH_TOKEN); TLS when tls_ca is set
    # (the CA that signed the learner's certificate), mutual TLS with tls_cert and tls_key.
    auth_token_file: str = ""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    # The name the learner's certificate carries, when it differs from the address's host.
    tls_server_name: str = ""
