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
checkpoint; the actors reconnect by themselves.

It shows the live progress line and reports restarts. When the run ends, on Ctrl-C or
SIGTERM, it stops the learner (which writes its final checkpoint), then removes every
Ray actor it started. The learner's logdir is on the learner's node (use shared storage
to read it elsewhere). Exit code: 0; 1 when a target return was set and not reached, when the
learner failed, or when every actor ran out of restarts; 2 when no Ray cluster answers at
--address or a resource flag is not a JSON object.
"""

from __future__ import annotations

import dataclasses
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
from fleetrl.launch.ray_hosts import FleetrlActor, FleetrlLearner
from fleetrl.learner.config import LearnerConfig
from fleetrl.proto import learner_pb2 as pb

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy
except ImportError as e:  # says which extra brings it
    raise MissingExtra("launch.ray", "ray", e) from e

define_flags(LearnerConfig, skip=("bind",))
define_flags(FleetConfig)
define_flags(RayConfig, skip=("learner", "fleet"))
FLAGS = flags.FLAGS

ACTORS_GONE = "every actor is out of restarts"


def ray_options(resources: dict[str, float]) -> dict[str, Any]:
    """Ray's actor options for a resource request such as {"CPU": 1, "GPU": 1, "my_node": 1}."""
    custom = {k: float(v) for k, v in resources.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": float(resources.get("CPU", 0)), "num_gpus": float(resources.get("GPU", 0)),
            "resources": custom}


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
    placement = None
    try:
        learner, placement = _start_learner(config)
        handles.append(learner)
        info = _learner_info(learner, config.start_timeout_s, stop_requested)
        if info is None:
            return 1
        print(f"fleetrl: {config.learner.problem} learner (pid {info['pid']}) on node {info['node_id'][:8]} "
              f"({info['ip']}), "
              f"serving {info['address']}, logdir {info['logdir']} on that node")
        actors = {}
        security = dict(auth_token_file=config.learner.auth_token_file, tls_ca=config.tls_ca,
                        tls_cert=config.actor_tls_cert, tls_key=config.actor_tls_key,
                        tls_server_name=config.tls_server_name)
        for name, actor_config in config.fleet.actor_configs(config.learner, info["address"], **security):
            resources = config.resources("eval_actor_resources" if actor_config.mode == "eval" else "actor_resources")
            handle = ray.remote(FleetrlActor).options(
                max_restarts=config.max_restarts, max_concurrency=2, scheduling_strategy="SPREAD",
                **ray_options(resources)
            ).remote(dataclasses.asdict(actor_config))
            actors[name] = handle
            handles.append(handle)
        summary = _serve(learner, actors, config.progress_interval_s, stop_requested, config.start_timeout_s)
    finally:
        for handle in handles:  # nothing stays on the cluster: not even an actor Ray would restart
            ray.kill(handle, no_restart=True)
        if placement is not None:
            ray.util.remove_placement_group(placement)
        ray.shutdown()
    if summary is None or "error" in summary:
        print(f"the learner failed:\n{(summary or {}).get('error', 'no summary')}", file=sys.stderr)
        return 1
    print_summary(summary)
    if stop_requested and stop_requested[0] == ACTORS_GONE:
        return 1
    return 1 if summary.get("target_reached") is False and not stop_requested else 0


def _start_learner(config: RayConfig):
    """The learner in a placement group of its resources: Ray restarts it there, on the same
    node, where its actors find it again. Without resources it goes on this node."""
    resources = config.resources("learner_resources")
    options = ray_options(resources)
    placement = None
    if any(resources.values()):
        placement = ray.util.placement_group([{k: float(v) for k, v in resources.items() if v}])
        strategy = PlacementGroupSchedulingStrategy(placement)
    else:
        strategy = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    learner = ray.remote(FleetrlLearner).options(
        max_restarts=config.learner_max_restarts, max_concurrency=4, scheduling_strategy=strategy, **options
    ).remote(dataclasses.asdict(config.learner))
    return learner, placement


def _learner_info(learner, timeout_s: float, stop_requested: list[str]) -> dict[str, Any] | None:
    """Waits for the learner to be placed and serving; None if it failed or the wait was cut short."""
    ref, deadline = learner.info.remote(), time.monotonic() + timeout_s
    while not stop_requested and time.monotonic() < deadline:
        ready, _ = ray.wait([ref], timeout=1.0)
        if ready:
            try:
                return ray.get(ref)
            except ray.exceptions.ActorUnavailableError:  # Ray is restarting it: ask again
                time.sleep(0.5)
                ref = learner.info.remote()
            except ray.exceptions.RayError as e:
                print(f"the learner could not start: {e}", file=sys.stderr)
                return None
    print("the learner was not serving in time (are its --learner_resources available on the cluster?)"
          if not stop_requested else f"{stop_requested[0]}: stopping", file=sys.stderr)
    return None


def _serve(learner, actors: dict[str, Any], interval_s: float, stop_requested: list[str],
           start_timeout_s: float) -> dict[str, Any] | None:
    """Shows progress and reports actor placements and restarts, and the learner's, until
    the learner's run ends."""
    progress, watch = Progress(sys.stdout.isatty()), _Watch()
    while True:
        try:
            return _serve_until_done(learner, actors, interval_s, stop_requested, progress, watch)
        except ray.exceptions.RayActorError as e:  # the learner's process died (out of memory, killed)
            progress.end()
            if stop_requested:
                return {"error": f"the learner's process died while stopping: {e}"}
            print("the learner's process died; waiting for Ray to restart it", flush=True)
            info = _learner_info(learner, start_timeout_s, stop_requested)
            if info is None:
                return {"error": f"the learner's process died and did not come back: {e}"}
            print(f"learner restarted: pid {info['pid']} on node {info['node_id'][:8]}, resumed from "
                  f"{info['resumed_from']} at trainer step {info['resumed_steps']}", flush=True)


def _serve_until_done(learner, actors: dict[str, Any], interval_s: float, stop_requested: list[str],
                      progress: Progress, watch: _Watch) -> dict[str, Any] | None:
    while True:
        if stop_requested:
            progress.end()
            print(f"{stop_requested[0]}: stopping")
            reason = stop_requested[0]
            learner.stop.remote(reason if reason == ACTORS_GONE else f"stopped by {reason}")
            return ray.get(learner.wait.remote(60.0))
        summary = ray.get(learner.wait.remote(0.0))
        if summary is not None:
            progress.end()
            return summary
        progress.show(pb.Status.FromString(ray.get(learner.status.remote())))
        _watch(actors, watch, progress)
        train = [name for name in actors if not name.startswith("eval")]
        if train and all(name in watch.gone for name in train):
            stop_requested.append(ACTORS_GONE)
        time.sleep(interval_s)


@dataclasses.dataclass
class _Watch:
    """What the launcher knows of each actor: its current process, and which ones it reported."""

    placed: dict[str, int] = dataclasses.field(default_factory=dict)  # name -> pid
    rejoining: set[str] = dataclasses.field(default_factory=set)
    gone: set[str] = dataclasses.field(default_factory=set)  # out of restarts


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
    return launcher_main(RayConfig, f"0.0.0.0:{FLAGS.learner_port}", launch)


def run() -> None:
    run_main(main, __doc__, problem_flags=True)


if __name__ == "__main__":
    run()
