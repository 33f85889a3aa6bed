"""The launchers' configurations: the fleet of actors, and what `launch.local`, `launch.ray`
and `launch.evaluate` add to it. Each field is a flag of its launcher, with this help.

The fleet's sizes are Problem settings (`Problem.launch_defaults`): left unset, they take the
Problem's choice (LIBERO wants 1 env per actor, not CartPole's 32) when the launcher's
config is built.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from fleetrl.actor.config import ActorConfig
from fleetrl.common.settings import check_range, fill_problem_settings, problem_setting, setting
from fleetrl.learner.config import LearnerConfig
from fleetrl.problems.registry import problem_class


@dataclasses.dataclass
class FleetConfig:
    """The actors a launcher starts."""

    num_actors: int | None = problem_setting(2, "Actor processes to start.")
    envs_per_actor: int | None = problem_setting(32, "Envs each actor steps.")
    async_envs: bool = setting(False, "Actors step their envs in subprocesses (for heavy simulators).")
    env_groups: int = setting(1, "Each actor's envs in this many groups that take turns, so that stepping one "
                                 "overlaps the other's round trip to the learner (2: double buffering).")
    num_eval_actors: int = setting(0, "Eval actor processes: they play the Problem's eval set each eval round "
                                      "and feed eval/ summaries and checkpoints/best.pt.")
    eval_envs_per_actor: int | None = problem_setting(8, "Envs each eval actor plays at once.")
    max_reconnect_s: float = setting(60.0, "Actors give up after this long without the learner.")

    def resolve(self, problem: str) -> None:
        """Fills the sizes left unset from the Problem's `launch_defaults`, and checks them."""
        fill_problem_settings(self, problem_class(problem).launch_defaults)
        check_range("num_actors", self.num_actors, low=0)
        check_range("num_eval_actors", self.num_eval_actors, low=0)
        for name in ("envs_per_actor", "eval_envs_per_actor"):
            check_range(name, getattr(self, name), low=1)
        check_range("env_groups", self.env_groups, low=1, high=self.envs_per_actor)

    def actor_configs(self, learner: LearnerConfig, learner_address: str, id_prefix: str | None = None,
                      rank_addresses: Sequence[str] = (), **security: str) -> list[tuple[str, ActorConfig]]:
        """(name, config) of each actor, eval actors last; with `id_prefix`, each one's actor
        id is the prefix and its name (else hostname:pid). With learner ranks' addresses,
        actor i serves rank i mod their number; eval actors serve `learner_address` (rank
        0), so each eval episode is played once."""
        def actor(name: str, **fields) -> tuple[str, ActorConfig]:
            actor_id = f"{id_prefix}{name}" if id_prefix is not None else ""
            fields.setdefault("learner_address", learner_address)
            return name, ActorConfig(problem=learner.problem, actor_id=actor_id,
                                     max_reconnect_s=self.max_reconnect_s, **security, **fields)

        ranks = list(rank_addresses) or [learner_address]
        return [actor(f"actor-{i}", learner_address=ranks[i % len(ranks)], num_envs=self.envs_per_actor,
                      seed=learner.seed * 1000 + i, async_envs=self.async_envs, env_groups=self.env_groups)
                for i in range(self.num_actors)] + \
               [actor(f"eval-actor-{i}", num_envs=self.eval_envs_per_actor, mode="eval")
                for i in range(self.num_eval_actors)]


@dataclasses.dataclass
class LearnerLaunchConfig:
    """`launch.learner`: one learner (or learner rank) that actors started elsewhere join."""

    learner: LearnerConfig
    progress_interval_s: float = setting(1.0, "Seconds between progress lines (redrawn in place on a terminal, "
                                              "every 10 s in a log); 0: none.")

    def __post_init__(self):
        check_range("progress_interval_s", self.progress_interval_s, low=0)


@dataclasses.dataclass
class LocalConfig:
    """`launch.local`: the learner, its actors and eval actors as processes on this machine."""

    learner: LearnerConfig
    fleet: FleetConfig
    tensorboard_port: int = setting(0, "Also start TensorBoard on this port (0: don't).")
    progress_interval_s: float = setting(1.0, "Seconds between progress updates.")
    learner_ranks: int = setting(1, "Data-parallel learner processes (gloo on CPU, NCCL on GPU); actor i serves "
                                    "rank i mod this, eval actors rank 0 (docs/deployment.md).")

    def __post_init__(self):
        self.fleet.resolve(self.learner.problem)
        check_range("progress_interval_s", self.progress_interval_s, low=0, low_open=True)
        check_range("learner_ranks", self.learner_ranks, low=1)


@dataclasses.dataclass
class DebugConfig:
    """`launch.debug`: the learner and its actors in this process, on one thread (docs/debugging.md)."""

    learner: LearnerConfig
    fleet: FleetConfig
    post_mortem: bool = setting(False, "Open pdb at an uncaught exception, where it was raised.")
    deterministic: bool = setting(True, "torch.use_deterministic_algorithms: with the same --seed, two runs give "
                                        "the same weights, counters and summaries.")
    summary_every_updates: int = setting(10, "TensorBoard summaries every this many updates (the served learner's "
                                             "--summary_interval_s would make them depend on the run's speed).")
    eval_every_updates: int = setting(50, "With --num_eval_actors: an eval round, played to its end before "
                                          "training goes on, every this many updates (in place of "
                                          "--eval_interval_s).")
    progress: bool = setting(True, "A progress line at each summary.")

    def __post_init__(self):
        self.fleet.resolve(self.learner.problem)
        check_range("summary_every_updates", self.summary_every_updates, low=1)
        check_range("eval_every_updates", self.eval_every_updates, low=1)


@dataclasses.dataclass
class RayConfig:
    """`launch.ray`: the same learner and actors, placed, started and restarted by a Ray cluster."""

    learner: LearnerConfig
    fleet: FleetConfig
    address: str = setting("auto", "The Ray cluster: auto (the one this machine belongs to), or host:port of its "
                                   "head.")
    learner_port: int = setting(0, "Port the learner serves on, on its node (0: any free one).")
    learner_resources: str = setting('{"CPU": 1}', "Ray resources of the learner, JSON: CPU, GPU and custom ones.")
    actor_resources: str = setting('{"CPU": 1}', "Ray resources of each actor, JSON.")
    eval_actor_resources: str = setting('{"CPU": 1}', "Ray resources of each eval actor, JSON.")
    max_restarts: int = setting(10, "Times Ray restarts a crashed actor (-1: without limit).")
    learner_max_restarts: int = setting(3, "Times Ray restarts the learner's process when it dies (-1: without "
                                           "limit). It comes back on the same node and port, resumes from the "
                                           "logdir's latest checkpoint, and the actors reconnect by themselves. "
                                           "Learner ranks restart together, all of them each time one dies.")
    learner_ranks: int = setting(1, "Data-parallel learner ranks, in one placement group of this many "
                                    "--learner_resources bundles; actor i serves rank i mod this, eval actors rank "
                                    "0 (docs/deployment.md).")
    tls_ca: str = setting("", "Actors: CA (PEM) that signed the learner's certificate; turns TLS on.")
    actor_tls_cert: str = setting("", "Actors' client certificate (PEM), for mutual TLS.")
    actor_tls_key: str = setting("", "Private key (PEM) of --actor_tls_cert.")
    tls_server_name: str = setting("", "The host name in the learner's certificate, when it differs from its IP.")
    start_timeout_s: float = setting(600.0, "Give up when the learner is not serving after this long (placement "
                                            "included).")
    progress_interval_s: float = setting(1.0, "Seconds between progress updates.")
    placement_timeout_s: float = setting(60.0, "Report the actors Ray has not placed after this long, with the "
                                               "resources they ask and the cluster's free ones; the launch fails "
                                               "when no train actor is placed by then.")
    log_to_driver: bool = setting(False, "Also print the learner's and actors' logs here (Ray's log_to_driver).")

    def __post_init__(self):
        self.fleet.resolve(self.learner.problem)
        for name in ("learner_resources", "actor_resources", "eval_actor_resources"):
            self.resources(name)  # refused now, before any connection to the cluster
        check_range("max_restarts", self.max_restarts, low=-1)
        check_range("placement_timeout_s", self.placement_timeout_s, low=0, low_open=True)
        check_range("learner_max_restarts", self.learner_max_restarts, low=-1)
        check_range("learner_ranks", self.learner_ranks, low=1)
        if self.learner_ranks > 1 and not any(self.resources("learner_resources").values()):
            raise ValueError("--learner_ranks places each rank in a bundle of --learner_resources: give it some, "
                             "such as '{\"CPU\": 1}' or '{\"GPU\": 1}'")

    def resources(self, name: str) -> dict[str, float]:
        """The resource request of flag `name`, such as {"CPU": 1, "GPU": 1, "my_node": 1}."""
        text = getattr(self, name)
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, dict) or not all(isinstance(v, (int, float)) for v in value.values()):
            raise ValueError(f"--{name} takes a JSON object of amounts, such as '{{\"CPU\": 1, \"GPU\": 1}}', "
                             f"not {text!r}")
        return value


@dataclasses.dataclass
class EvaluateConfig:
    """`launch.evaluate`: a checkpoint's greedy policy on the Problem's eval set, without a run."""

    checkpoint: str = setting("", "A checkpoint file (ckpt-*.pt or best.pt), or a run's logdir: its best.pt if "
                                  "an eval round wrote one, else its latest checkpoint. Empty with --problem: the "
                                  "Problem's agent as built, say a pretrained pi0.5 that --hparams=model_path=... "
                                  "names.")
    problem: str = setting("", "The Problem; default: the checkpoint's. A subclass of the checkpoint's Problem (one "
                               "that renders, say) may play its weights.")
    allow_other_problem: bool = setting(False, "Let a --problem that is not the checkpoint's, nor a subclass of "
                                               "it, play its weights, if their shapes fit.")
    hparams: str | None = setting(None, "Overrides of the Problem's config, on top of the checkpoint's (say "
                                        "greedy_eval=false); with a --problem of another family, the whole config.")
    episodes: int = setting(0, "Episodes of the eval set to play; 0: the Problem's eval_episodes.")
    num_envs: int = setting(8, "Envs played at once.")
    output: str = setting("", "Where to write the metrics JSON and recordings; default: <checkpoint>-eval/.")
    record: bool = setting(False, "Save episodes as animations (GIF or MP4, and TensorBoard).")
    record_episodes: int = setting(4, "How many episodes (the first ones) --record saves.")
    record_format: str = setting("gif", "File format of recorded episodes: gif or mp4.")
    record_fps: float = setting(10.0, "Frames per second of recorded episodes.")
    device: str = setting("cpu", "Torch device.")

    def __post_init__(self):
        if not self.checkpoint and not self.problem:
            raise ValueError("--checkpoint is required: a checkpoint file (ckpt-*.pt or best.pt) or a run's logdir; "
                             "or --problem with --hparams naming pretrained weights, to play them as they are")
        check_range("episodes", self.episodes, low=0)
        check_range("num_envs", self.num_envs, low=1)
        if self.record_format not in ("gif", "mp4"):
            raise ValueError(f"--record_format must be gif or mp4, got {self.record_format!r}")


@dataclasses.dataclass
class ExportConfig:
    """`launch.export`: a checkpoint's weights alone, loadable anywhere with weights_only=True."""

    checkpoint: str = setting("", "A checkpoint file (ckpt-*.pt or best.pt), or a run's logdir (its best.pt if an "
                                  "eval round wrote one, else its latest checkpoint).")
    output: str = setting("model.pt", "Where to write the weights.")
    problem: str = setting("", "--pretrained_dir: the Problem that rebuilds the agent, when the checkpoint's is an "
                               "import path of your own (fleetrl imports no module that a file names); default: "
                               "the checkpoint's, if registered.")
    pretrained_dir: str = setting("", "Vision-language agents: also write the fine-tuned model to this folder, "
                                  "LoRA adapters merged into the base weights, with its processor, as "
                                  "`from_pretrained` loads it (and the value head as value_head.pt).")

    def __post_init__(self):
        if not self.checkpoint:
            raise ValueError("--checkpoint is required: a checkpoint file (ckpt-*.pt or best.pt)")
