"""The actor's configuration, built once at the entry point and passed down.

Every field is also a flag of `launch.actor`, with the help text given here.
"""

from __future__ import annotations

import dataclasses

from fleetrl.common.settings import check_choice, check_range, setting

MODES = ("train", "eval")


@dataclasses.dataclass
class ActorConfig:
    learner_address: str = setting("127.0.0.1:8686", "host:port or unix:/path of the learner; a comma-separated "
                                                      "list of learner ranks' addresses: the actor serves the one "
                                                      "its id picks (a SHA-256 of the id, mod their count), always.")
    problem: str | None = setting(None, "The Problem; default: ask the learner which Problem (and hparams) it "
                                        "serves.")
    hparams: dict[str, str] = setting(default_factory=dict,
                                      help_text="This actor's own overrides of the learner's hparams, e.g. an R2R "
                                                "shard: scans=[a,b].")
    mode: str = setting("train", "train: send experience to the trainer; eval: play the learner's eval rounds "
                                 "deterministically and send only episode metrics.")
    num_envs: int = setting(32, "Envs this actor steps as one batch.")
    actor_id: str = setting("", "Unique id of this actor among the connected ones; default hostname:pid.")
    seed: int = setting(0, "Random seed of the envs' first resets.")
    async_envs: bool = setting(False, "Step envs in subprocesses; worth it only for heavy simulators.")
    env_groups: int = setting(1, "Split the envs into this many groups that take turns: while one group's step "
                                 "waits for its actions, the next group steps (2: double buffering). Each group "
                                 "is a whole number of GRPO groups.")
    max_reconnect_s: float = setting(60.0, "Give up (exit non-zero) after this long without reaching the learner.")
    max_message_mb: int = setting(64, "Largest message sent or received, in MiB.")
    # Security: the shared token; TLS when tls_ca is set, mutual TLS with tls_cert and tls_key.
    auth_token_file: str = setting("", "File holding the shared auth token (else $FLEETRL_AUTH_TOKEN).")
    tls_ca: str = setting("", "CA (PEM) that signed the learner's certificate; turns TLS on.")
    tls_cert: str = setting("", "This actor's client certificate (PEM), for mutual TLS.")
    tls_key: str = setting("", "Private key (PEM) of --tls_cert.")
    tls_server_name: str = setting("", "The host name in the learner's certificate, when the address's differs.")

    def __post_init__(self):
        check_choice("actor mode", self.mode, MODES)
        check_range("num_envs", self.num_envs, low=1)
        check_range("env_groups", self.env_groups, low=1, high=self.num_envs)
        check_range("max_reconnect_s", self.max_reconnect_s, low=0)
        check_range("max_message_mb", self.max_message_mb, low=1)
