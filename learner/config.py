"""The learner's configuration, built once at the entry point and passed down.

Every field is also a flag of `launch.learner`, `launch.local` and `launch.ray`, with the
help text given here. The settings a Problem may choose (`problem_setting`) are filled in
`__post_init__` from the Problem's `learner_defaults` when left unset, so
`LearnerConfig(problem="r2r")` is the same config as `--problem=r2r` on the command line.
"""

from __future__ import annotations

import dataclasses
import os

from fleetrl.common.settings import check_choice, check_range, fill_problem_settings, problem_setting, setting
from fleetrl.problems.registry import problem_class


@dataclasses.dataclass
class LearnerConfig:
    problem: str = setting("cartpole", "A registered Problem name (see fleetrl.problems.registry) or an import "
                                       "path module:Class.")
    hparams: dict[str, str] = setting(
        default_factory=dict,
        help_text="Overrides of the Problem's config, e.g. learning_rate=3e-4,hidden_sizes=[128,128] (see "
                  "fleetrl.problems.hparams); each is also a flag of its own, --learning_rate=3e-4.")
    logdir: str = setting("runs/default", "Where TensorBoard summaries, checkpoints and run files go.")
    bind: str = setting("127.0.0.1:8686", "Address the learner serves: host:port (port 0 picks a free one) or "
                                          "unix:/path. The default serves this machine only; use 0.0.0.0:PORT to "
                                          "serve other hosts.")
    unroll_length: int | None = problem_setting(20, "T: each unroll has T+1 steps, the first being the previous "
                                                    "unroll's last.")
    batch_size: int | None = problem_setting(8, "B: unrolls per trainer step. Small batches mean more updates per "
                                                "env step; raise it with the fleet's size.")
    inference_batch_size: int | None = problem_setting(64, "Envs per inference forward pass: a batch flushes at "
                                                           "this size, or when it holds every connected env...")
    inference_timeout_ms: float = setting(5.0, "...or this long after its first request arrived.")
    unroll_queue_size: int | None = problem_setting(64, "Finished unrolls waiting for the trainer; when full, "
                                                        "inference waits (bounds memory and policy lag).")
    train: bool = setting(True, "Train on the unrolls; false: serve the policy as it is, assembling unrolls and "
                                "dropping them (capacity benchmarks, or collecting with a fixed policy).")
    total_env_steps: int = setting(0, "Stop after this many env steps (transitions); 0: no limit.")
    target_mean_return: float | None = setting(None, "Stop once the mean return of the last return_window "
                                                     "episodes reaches this.")
    return_window: int = setting(100, "Episodes in the recent-return window.")
    block_inference_on_training: bool | None = problem_setting(
        False, "Hold inference while the trainer updates (SEED RL's option of that name), so that PPO trains on "
               "data at most one update behind.")
    summary_interval_s: float = setting(5.0, "Seconds between TensorBoard writes once the run has gone a while; its "
                                             "first minutes write every uptime/100 s (at least every 1 s), so a "
                                             "short run still draws curves.")
    torch_threads: int = setting(1, "torch intra-op threads of each of the inference and training threads. 1 is "
                                    "fastest for small models on few cores.")
    max_actors: int = setting(64, "Actor streams served at once (a coroutine each on the server's event loop); "
                                  "a stream beyond them is refused, naming this flag.")
    max_envs_per_actor: int = setting(1024, "Largest num_envs an actor's handshake may ask for (each env holds a "
                                            "partial unroll).")
    max_message_mb: int = setting(64, "Largest message accepted, in MiB; a larger one is refused with "
                                      "INVALID_ARGUMENT (up to the transport's hard cap of 4x this).")
    device: str = setting("cpu", "Torch device of the model: cpu, cuda, cuda:1, ...")
    inference_transfer: str = setting("auto", "How inference batches reach the device and come back: staged (one "
                                              "pinned buffer and one copy each way), plain (tensor by tensor), or "
                                              "auto (staged on a GPU, plain on CPU, where plain copies nothing).")
    seed: int = setting(0, "Random seed.")
    world_size: int = setting(1, "Data-parallel learner ranks, each a whole learner serving its own actors, all "
                                 "holding the same weights (torchrun's WORLD_SIZE sets it; docs/deployment.md).")
    rank: int = setting(0, "This learner's rank, 0 .. world_size-1 (torchrun's RANK sets it). Rank 0 writes "
                           "checkpoints, TensorBoard and the run files; rank r serves on --bind's port + r.")
    fsdp: bool = setting(False, "Learner ranks: train with FSDP, each rank holding 1/world_size of the trained "
                                "weights, gradients and optimizer state; inference keeps a whole copy, refreshed "
                                "after each update (docs/deployment.md).")
    collective_timeout_s: float = setting(300.0, "Learner ranks: a rank that does not join a collective (the "
                                                 "per-batch exchange, a gradient all-reduce) within this long ends "
                                                 "every rank with an error naming it.")

    eval_interval_s: float | None = problem_setting(30.0, "Eval rounds (eval actors play the Problem's eval set "
                                                          "with the weights frozen at the round's start) start at "
                                                          "most this often.")
    checkpoint_interval_s: float = setting(300.0, "Write a checkpoint this often, in seconds (0: off); one is "
                                                  "always written at the end. A restart on the same logdir "
                                                  "resumes from the latest.")
    checkpoint_every_steps: int = setting(0, "Also write one every this many trainer steps (0: off).")
    record_unrolls: int = setting(0, "Write the first N training batches (observations, actions, rewards, dones, "
                                     "behaviour log-probs, the loss's advantages and targets) to "
                                     "<logdir>/recorded_unrolls.npz; `python -m fleetrl.launch.inspect FILE` reads "
                                     "it (docs/debugging.md). 0: off.")
    keep_checkpoints: int = setting(3, "Periodic checkpoints kept in <logdir>/checkpoints (best.pt is kept apart).")
    best_metric: str | None = problem_setting("return", "Eval episode metric whose best round's weights go to "
                                                        "checkpoints/best.pt.")
    best_mode: str | None = problem_setting("max", "max or min: which way best_metric is better.")
    target_eval_metric: float | None = setting(None, "Stop once an eval round's best_metric reaches this (at or "
                                                     "above it with best_mode max, at or below with min), its "
                                                     "weights written to checkpoints/best.pt.")
    init_checkpoint: str = setting("", "Warm start: load only the weights of this checkpoint (a file, or a run's "
                                                   "logdir: its best.pt, else its latest) into a new run.")
    init_checkpoint_any_problem: bool = setting(False, "Let --init_checkpoint come from another Problem (or a "
                                                       "renamed one): its tensors whose names this agent has are "
                                                       "taken, the learner's log names what was taken and what was "
                                                       "not, and a shape that differs is refused with its name.")

    # Security (see fleetrl.learner.transport.security).
    auth_token_file: str = setting("", "File holding the shared auth token (else $FLEETRL_AUTH_TOKEN); calls "
                                       "without it are refused with UNAUTHENTICATED.")
    tls_cert: str = setting("", "TLS certificate (PEM) of the learner.")
    tls_key: str = setting("", "Private key (PEM) of --tls_cert.")
    tls_client_ca: str = setting("", "CA (PEM) that must have signed the actors' certificates (mutual TLS).")
    handshake_timeout_s: float = setting(10.0, "A stream that sends no handshake within this long is ended with "
                                               "DEADLINE_EXCEEDED.")
    stream_idle_timeout_s: float = setting(300.0, "A train stream that sends no step for this long after its "
                                                  "last answer is cancelled (and the learner logs why), freeing its "
                                                  "--max_actors place; raise it for envs slower per step. Eval "
                                                  "streams, which wait between rounds, get eval_interval_s more.")

    def __post_init__(self):
        if os.path.exists(self.logdir) and not os.path.isdir(self.logdir):
            raise ValueError(f"--logdir={self.logdir} is a file, not a folder: choose another --logdir")
        # Unknown Problems fail here, by name (UnknownProblemError is a ValueError).
        fill_problem_settings(self, problem_class(self.problem).learner_defaults)
        for name in ("unroll_length", "batch_size", "inference_batch_size", "unroll_queue_size", "return_window",
                     "torch_threads", "max_actors", "max_envs_per_actor", "max_message_mb", "keep_checkpoints"):
            check_range(name, getattr(self, name), low=1)
        for name in ("inference_timeout_ms", "total_env_steps", "eval_interval_s",
                     "checkpoint_interval_s", "checkpoint_every_steps", "record_unrolls"):
            check_range(name, getattr(self, name), low=0)
        for name in ("summary_interval_s", "handshake_timeout_s", "stream_idle_timeout_s"):
            check_range(name, getattr(self, name), low=0, low_open=True)
        check_choice("best_mode", self.best_mode, ("max", "min"))
        check_range("world_size", self.world_size, low=1)
        check_range("rank", self.rank, low=0, high=self.world_size - 1)
        check_range("collective_timeout_s", self.collective_timeout_s, low=0, low_open=True)
        check_choice("inference_transfer", self.inference_transfer, ("auto", "plain", "staged"))
