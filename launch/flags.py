"""absl flags generated from config dataclasses, and the way back to a command line.

Each config field becomes a flag of the same name, with the help text below. `to_argv`
renders a config as flags, so `launch.local` starts the learner and actors with exactly
the config it was given.
"""

from __future__ import annotations

import dataclasses
import os
import time
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags

from fleetrl.learner.config import LearnerConfig
from fleetrl.problems.hparams import format_hparams, parse_hparams
from fleetrl.problems.registry import UnknownProblemError, problem_class

HELP = {
    "problem": "A registered Problem name (see fleetrl.problems.registry) or an import path module:Class.",
    "hparams": "Overrides of the Problem's config, e.g. learning_rate=3e-4,hidden_sizes=[128,128].",
    "logdir": "Where TensorBoard summaries and run files go.",
    "bind": "Address the learner serves: host:port (port 0 picks a free one) or unix:/path. "
            "The default serves this machine only; use 0.0.0.0:PORT to serve other hosts.",
    "unroll_length": "T: each unroll has T+1 steps, the first being the previous unroll's last.",
    "batch_size": "B: unrolls per trainer step.",
    "inference_batch_size": "Envs per inference forward pass: a batch flushes at this size...",
    "inference_timeout_ms": "...or this long after its first request arrived.",
    "unroll_queue_size": "Finished unrolls waiting for the trainer; when full, inference waits "
                         "(bounds memory and lag).",
    "total_env_steps": "Stop after this many env steps (transitions); 0 for no limit.",
    "target_mean_return": "Stop once the mean return of the last return_window episodes reaches this.",
    "return_window": "Episodes in the recent-return window.",
    "block_inference_on_training": "Hold inference while the trainer updates, for on-policy training (PPO).",
    "summary_interval_s": "Seconds between TensorBoard writes.",
    "torch_threads": "torch intra-op threads (torch.set_num_threads). 1 is fastest for small models on few cores.",
    "max_actors": "Actor streams served at once (one gRPC thread each).",
    "max_envs_per_actor": "Largest num_envs an actor's handshake may ask for.",
    "max_message_mb": "Largest gRPC message accepted, in MiB.",
    "device": "Torch device of the model: cpu, cuda, cuda:1, ...",
    "seed": "Random seed.",
    "learner_address": "host:port or unix:/path of the learner.",
    "num_envs": "Envs this actor steps as one batch.",
    "actor_id": "Unique id of this actor; default hostname:pid.",
    "async_envs": "Step envs in subprocesses (for heavy simulators).",
    "max_reconnect_s": "Give up (exit non-zero) after this long without reaching the learner.",
    "mode": "train: send experience to the trainer; eval: play the learner's eval rounds deterministically.",
    "eval_interval_s": "Eval rounds (the Problem's eval set, played by eval actors) start at most this often.",
    "checkpoint_interval_s": "Write a checkpoint this often, in seconds (0: off); one is always written at the end.",
    "checkpoint_every_steps": "Also write one every this many trainer steps (0: off).",
    "keep_checkpoints": "Periodic checkpoints kept in <logdir>/checkpoints (best.pt is kept apart).",
    "best_metric": "Eval episode metric whose best round's weights go to checkpoints/best.pt.",
    "best_mode": "max or min: which way best_metric is better.",
    "init_checkpoint": "Warm start: load only the weights of this checkpoint into a new run.",
    "auth_token_file": "File holding the shared auth token (else $FLEETRL_AUTH_TOKEN); calls without it are refused.",
    "tls_cert": "TLS certificate (PEM): the learner's, or an actor's client certificate for mutual TLS.",
    "tls_key": "Private key (PEM) of --tls_cert.",
    "tls_client_ca": "Learner: CA (PEM) that must have signed the actors' certificates (mutual TLS).",
    "tls_ca": "Actor: CA (PEM) that signed the learner's certificate; turns TLS on.",
    "tls_server_name": "Actor: the host name in the learner's certificate, when the address differs.",
    "handshake_timeout_s": "A stream that sends no handshake within this long is cancelled.",
}


def define_flags(config_cls: type, skip: tuple[str, ...] = (), prefix: str = "") -> None:
    """Defines one absl flag per field of `config_cls`, defaulting to the field's default."""
    hints = typing.get_type_hints(config_cls)
    for field in dataclasses.fields(config_cls):
        name = prefix + field.name
        if field.name in skip or name in flags.FLAGS:
            continue
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        kind, help_text = hints[field.name], HELP.get(field.name, field.name)
        if kind is bool:
            flags.DEFINE_boolean(name, default, help_text)
        elif kind is int:
            flags.DEFINE_integer(name, default, help_text)
        elif kind is float:
            flags.DEFINE_float(name, default, help_text)
        elif kind in (str, str | None, float | None):
            flags.DEFINE_string(name, None if default is None else str(default), help_text)
        elif kind == dict[str, str]:
            flags.DEFINE_string(name, format_hparams(default), help_text)
        else:
            raise TypeError(f"{config_cls.__name__}.{field.name}: no flag type for {kind}")


def from_flags(config_cls: type, prefix: str = "", defaults: Mapping[str, Any] | None = None,
               **overrides: Any) -> Any:
    """A `config_cls` from the parsed flags. `defaults` replace the defaults of flags the
    command line did not set; `overrides` win over everything."""
    hints = typing.get_type_hints(config_cls)
    values = {}
    for field in dataclasses.fields(config_cls):
        if field.name in overrides or prefix + field.name not in flags.FLAGS:
            continue
        flag = flags.FLAGS[prefix + field.name]
        if defaults and field.name in defaults and not flag.present:
            values[field.name] = defaults[field.name]
            continue
        value = flag.value
        kind = hints[field.name]
        if kind == dict[str, str]:
            value = parse_hparams(value)
        elif kind == float | None:
            value = None if value in (None, "", "none", "None") else float(value)
        values[field.name] = value
    return config_cls(**values, **overrides)


def to_argv(config: Any, skip: tuple[str, ...] = ()) -> list[str]:
    """The command-line flags that reproduce `config`."""
    argv = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name in skip or value is None:
            continue
        if isinstance(value, dict):
            value = format_hparams(value)
        elif isinstance(value, bool):
            value = str(value).lower()
        argv.append(f"--{field.name}={value}")
    return argv


_problem_flags: list[str] = []


def define_problem_flags(argv: Sequence[str]) -> None:
    """Makes each field of the chosen Problem's config a flag of its own, so that
    `--suite=libero_10` means `--hparams=suite=libero_10`. Call it before absl parses
    `argv`. Fields whose name is already a flag (batch_size, seed, ...) stay hparams only,
    and an unknown Problem is left for the learner to report."""
    name = LearnerConfig.problem
    for i, arg in enumerate(argv):
        if arg.startswith("--problem="):
            name = arg.split("=", 1)[1]
        elif arg == "--problem" and i + 1 < len(argv):
            name = argv[i + 1]
    try:
        config_cls = problem_class(name).Config
    except UnknownProblemError:
        return
    for field in dataclasses.fields(config_cls):
        if field.name in flags.FLAGS:
            continue
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        flags.DEFINE_string(field.name, None, f"Problem hparam (default {default!r}); "
                            f"the same as --hparams={field.name}=VALUE.")
        _problem_flags.append(field.name)


def problem_hparams_from_flags(hparams: Mapping[str, str]) -> dict[str, str]:
    """`hparams` with the Problem's own flags that the command line set (those win)."""
    given = {name: flags.FLAGS[name].value for name in _problem_flags if flags.FLAGS[name].present}
    return {**hparams, **given}


def launch_flags_with_problem_defaults(names: Sequence[str]) -> dict[str, Any]:
    """The values of the flags `names`, with the Problem's `launch_defaults` for those the
    command line did not set."""
    try:
        defaults = problem_class(flags.FLAGS.problem).launch_defaults
    except UnknownProblemError:
        defaults = {}
    return {name: defaults[name] if name in defaults and not flags.FLAGS[name].present else flags.FLAGS[name].value
            for name in names}


def timestamped_logdir(problem: str) -> str:
    """runs/<problem>-<time>, the launchers' default logdir."""
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in problem.rsplit(":", 1)[-1]).lower()
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def learner_config_from_flags(**overrides: Any) -> LearnerConfig:
    """The LearnerConfig of the command line, with the Problem's `learner_defaults` for
    the flags it did not set, and the Problem's own flags merged into its hparams. An
    unknown Problem is left for the learner to report."""
    try:
        defaults = problem_class(flags.FLAGS.problem).learner_defaults
    except UnknownProblemError:
        defaults = {}
    config = from_flags(LearnerConfig, defaults=defaults, **overrides)
    return dataclasses.replace(config, hparams=problem_hparams_from_flags(config.hparams))
