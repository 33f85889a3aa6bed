"""A learner and fleets of actors on a Ray cluster:

    python -m fleetrl.launch.ray --address=auto --problem=cartpole --num_actors=16 --envs_per_actor=32

It connects to a running Ray cluster (`ray start --head`, KubeRay, ...), starts the learner
as a Ray actor where `--learner_resources` fit (a placement group holds that node for it),
then `--num_actors` actors (and
`--num_eval_actors` eval actors) spread over the nodes, each with its own resource
request (see `launch.ray_hosts`). Ray restarts a crashed actor up to `--max_restarts`
times, and the new process reconnects to the learner by itself. The training data flows
over fleetrl's gRPC stream, with its auth and TLS options; Ray only places, starts and
restarts processes. An actor that fails (the learner refused it, or stayed unreachable for
--max_reconnect_s) is restarted the same way. When the learner's process dies, Ray starts
it again (up to `--learner_max_restarts` times) in the same placement group, so on the
same node, where it serves on the same port and resumes from the logdir's latest
checkpoint; the actors reconnect by themselves. With `--learner_ranks=N`, N learner ranks
share one placement group and restart together (`launch.ray_learner_group`).

The learner listens on every interface of its node (`--bind=HOST` picks one; its port is
`--learner_port`'s), and actors dial the node's address. Without `--auth_token_file` or
`--tls_client_ca`, the run makes a random token and hands it to the learner and its own
actors through Ray: nobody else who reaches the node can join, or read the run's info.

It shows the live progress line and reports restarts. When the run ends, on Ctrl-C or
SIGTERM, it stops the learner (which writes its final checkpoint), then removes every
Ray actor it started. The learner's logdir is on the learner's node (use shared storage
to read it elsewhere). Exit code: 0; 1 when a target return was set and not reached, when the
learner failed, or when every actor ran out of restarts; 2 when no Ray cluster answers at
--address or a resource flag is not a JSON object.
"""

from __future__ import annotations

import dataclasses
import secrets
import signal
import sys
import time
from typing import Any

from absl import flags

from fleetrl.common.extras import MissingExtra
from fleetrl.launch.configs import FleetConfig, RayConfig
from fleetrl.launch.flags import (
    define_flags,
    launcher_main,
    run_main,
)
from fleetrl.launch.progress import Progress, print_summary
from fleetrl.launch.ray_hosts import FleetrlActor
from fleetrl.launch.ray_learner_group import LearnerGroup, ray_options
from fleetrl.learner.config import LearnerConfig

try:
    import ray
except ImportError as e:  # says which extra brings it
    raise MissingExtra("launch.ray", "ray", e) from e

define_flags(LearnerConfig)
define_flags(FleetConfig)
define_flags(RayConfig, skip=("learner", "fleet"))
FLAGS = flags.FLAGS

ACTORS_GONE = "every actor is out of restarts"
NONE_PLACED = "Ray placed no train actor"


def launch(config: RayConfig) -> int:
    try:
        ray.init(address=config.address, log_to_driver=config.log_to_driver)
    except ConnectionError as e:
        print(f"no Ray cluster at --address={config.address}: {e} Start one with `ray start --head` "
              f"(README: Across machines).", file=sys.stderr)
        return 2
    stop_requested: list[str] = []
    signal.signal(signal.SIGINT, lambda *_: stop_requested.append("Ctrl-C"))
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.append("SIGTERM"))
    handles: list = []
    group = None
    # Without the user's own token or client certificates, the run makes one: the learner
    # listens on the node's interfaces, and only this run's actors may join. It travels to
    # them through Ray, never on a command line or in a log.
    own_auth = config.learner.auth_token_file or config.learner.tls_client_ca
    token = None if own_auth else secrets.token_urlsafe(32)
    try:
        group = LearnerGroup(config, token)
        group.start()
        infos = group.info(config.start_timeout_s, stop_requested)
        if infos is None:
            return 1
        for info in infos:
            rank = f" rank {info['rank']}" if config.learner_ranks > 1 else ""
            print(f"fleetrl: {config.learner.problem} learner{rank} (pid {info['pid']}) on node {info['node_id'][:8]} "
                  f"({info['ip']}), serving {info['address']}, logdir {info['logdir']} on that node")
        addresses = [info["address"] for info in infos]
        actors, asked = {}, {}
        security = dict(auth_token_file=config.learner.auth_token_file, tls_ca=config.tls_ca,
                        tls_cert=config.actor_tls_cert, tls_key=config.actor_tls_key,
                        tls_server_name=config.tls_server_name)
        for name, actor_config in config.fleet.actor_configs(config.learner, addresses[0], rank_addresses=addresses,
                                                             **security):
            resources = config.resources("eval_actor_resources" if actor_config.mode == "eval" else "actor_resources")
            handle = ray.remote(FleetrlActor).options(
                max_restarts=config.max_restarts, max_concurrency=2, scheduling_strategy="SPREAD",
                **ray_options(resources)
            ).remote(dataclasses.asdict(actor_config), token)
            actors[name] = handle
            asked[name] = resources
            handles.append(handle)
        watch = _Watch(asked=asked, placement_timeout_s=config.placement_timeout_s)
        summary = _serve(group, actors, config.progress_interval_s, stop_requested, config.start_timeout_s, watch)
    finally:
        for handle in handles:  # nothing stays on the cluster: not even an actor Ray would restart
            ray.kill(handle, no_restart=True)
        if group is not None:
            group.remove()
        ray.shutdown()
    if summary is None or "error" in summary:
        print(f"the learner failed:\n{(summary or {}).get('error', 'no summary')}", file=sys.stderr)
        return 1
    print_summary(summary)
    if stop_requested and stop_requested[0] in (ACTORS_GONE, NONE_PLACED):
        return 1
    return 1 if summary.get("target_reached") is False and not stop_requested else 0


def _serve(group: LearnerGroup, actors: dict[str, Any], interval_s: float, stop_requested: list[str],
           start_timeout_s: float, watch: _Watch) -> dict[str, Any] | None:
    """Shows progress and reports actor placements and restarts, and the learner's, until
    the learner's run ends."""
    progress = Progress(sys.stdout.isatty())
    while True:
        try:
            failure = _serve_until_done(group, actors, interval_s, stop_requested, progress, watch)
            if isinstance(failure, dict):  # the run's summary
                return failure
        except ray.exceptions.RayActorError as e:  # the learner's process died (out of memory, killed)
            failure = f"the learner's process died: {e}"
        progress.end()
        if stop_requested:
            return {"error": f"{failure}, while stopping"}
        if group.size > 1:  # the ranks restart together
            if not group.can_restart():
                return {"error": f"{failure}; no learner restarts left (--learner_max_restarts)"}
            print(f"{failure}; restarting every learner rank from the latest checkpoint", flush=True)
            group.restart()
        else:
            print("the learner's process died; waiting for Ray to restart it", flush=True)
        infos = group.info(start_timeout_s, stop_requested)
        if infos is None:
            return {"error": f"{failure}, and it did not come back"}
        info = infos[0]
        what = "learner ranks restarted" if group.size > 1 else "learner restarted"
        print(f"{what}: pid {', '.join(str(i['pid']) for i in infos)} on node {info['node_id'][:8]}, resumed from "
              f"{info['resumed_from']} at trainer step {info['resumed_steps']}", flush=True)


def _serve_until_done(group: LearnerGroup, actors: dict[str, Any], interval_s: float, stop_requested: list[str],
                      progress: Progress, watch: _Watch) -> dict[str, Any] | str:
    """The run's summary once it ends, or why the learner ranks must restart."""
    while True:
        if stop_requested:
            progress.end()
            print(f"{stop_requested[0]}: stopping")
            reason = stop_requested[0]
            group.stop(reason if reason in (ACTORS_GONE, NONE_PLACED) else f"stopped by {reason}")
            return group.wait(60.0)
        summary = group.wait(0.0)
        if failure := group.failed_rank():  # after the wait: a rank 0 that ended by losing a rank is one
            return failure
        if summary is not None:
            progress.end()
            return summary
        progress.show(group.status())
        _watch(actors, watch, progress)
        train = [name for name in actors if not name.startswith("eval")]
        if train and all(name in watch.gone for name in train):
            stop_requested.append(ACTORS_GONE)
        if watch.placement_overdue():
            unplaced = watch.report_unplaced(list(actors), progress)
            if train and all(name in unplaced for name in train):
                stop_requested.append(NONE_PLACED)
        time.sleep(interval_s)


@dataclasses.dataclass
class _Watch:
    """What the launcher knows of each actor: its current process, and which ones it reported."""

    placed: dict[str, int] = dataclasses.field(default_factory=dict)  # name -> pid
    rejoining: set[str] = dataclasses.field(default_factory=set)
    gone: set[str] = dataclasses.field(default_factory=set)  # out of restarts
    asked: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)  # name -> Ray resources
    placement_timeout_s: float = 60.0
    started: float = dataclasses.field(default_factory=time.monotonic)
    reported_unplaced: bool = False

    def placement_overdue(self) -> bool:
        return not self.reported_unplaced and time.monotonic() - self.started >= self.placement_timeout_s

    def report_unplaced(self, names: list[str], progress: Progress) -> list[str]:
        """Prints each actor Ray has not placed, with what it asks and what the cluster has
        free; returns their names. Once: Ray may still place them as resources free up."""
        self.reported_unplaced = True
        unplaced = [name for name in names if name not in self.placed and name not in self.gone]
        if unplaced:
            progress.end()
            free = {k: v for k, v in sorted(ray.available_resources().items()) if not k.startswith("node:")}
            total = {k: v for k, v in sorted(ray.cluster_resources().items()) if not k.startswith("node:")}
            for name in unplaced:
                print(f"{name} is not placed after {self.placement_timeout_s:g}s: it asks {self.asked.get(name)}, "
                      f"and the cluster has {free} free of {total} (--actor_resources, --num_actors, or more "
                      "nodes)", flush=True)
        return unplaced


def _watch(actors: dict[str, Any], watch: _Watch, progress: Progress) -> None:
    placed, rejoining = watch.placed, watch.rejoining
    refs = {name: handle.info.remote() for name, handle in actors.items()}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=2.0)
    for name, ref in refs.items():
        if ref not in ready:
            continue
        try:
            info = ray.get(ref)
        except ray.exceptions.ActorDiedError as e:
            if name not in watch.gone:
                progress.end()
                print(f"{name} is gone for good (out of restarts): {e}", flush=True)
                watch.gone.add(name)
            continue
        except ray.exceptions.RayError:  # restarting
            continue
        previous = placed.get(name)
        if previous != info["pid"]:
            progress.end()
            what = "started" if previous is None else f"restarted (pid {previous} died)"
            print(f"{name} {what}: pid {info['pid']} on node {info['node_id'][:8]} ({info['ip']})", flush=True)
            placed[name] = info["pid"]
            if previous is not None:
                rejoining.add(name)
        if name in rejoining and info["steps"] > 0:  # the learner has answered the new process
            progress.end()
            print(f"{name} rejoined the learner: pid {info['pid']}, {info['steps']} steps so far", flush=True)
            rejoining.discard(name)
        if info["state"] == "failed":  # a refusal, or the learner unreachable for max_reconnect_s
            progress.end()
            print(f"{name} failed: {info['error']}", flush=True)
            ray.kill(actors[name], no_restart=False)  # Ray starts a new process, while restarts last


def main(argv: list[str]) -> int:
    del argv
    # --bind's host (its port, if any, is --learner_port's to set); by default every interface
    # of the learner's node, since actors on other nodes must reach it.
    host = "0.0.0.0" if FLAGS["bind"].using_default_value else bind_host(FLAGS.bind)
    return launcher_main(RayConfig, f"{host}:{FLAGS.learner_port}", launch)


def bind_host(bind: str) -> str:
    """The host part of `bind` (HOST, HOST:PORT, [IPv6] or [IPv6]:PORT)."""
    if bind.startswith("["):
        return bind[:bind.index("]") + 1]
    return bind.rsplit(":", 1)[0] if ":" in bind else bind


def run() -> None:
    run_main(main, __doc__, problem_flags=True)


if __name__ == "__main__":
    run()
