"""The learner's processes on a Ray cluster, as `launch.ray` starts, watches and restarts them.

One learner is one Ray actor (`ray_hosts.FleetrlLearner`). With resources it runs in a
placement group that holds its node; when its process dies, Ray restarts it there (its
`max_restarts`), it serves on the same port and resumes from the latest checkpoint.

Learner ranks (`--learner_ranks=N`) are N such actors in one placement group of N bundles
(PACK: as few nodes as fit them), rank r in bundle r. They meet as torchrun's would:
MASTER_ADDR is rank 0's node and MASTER_PORT a free port there. Ranks live and die
together: a rank alone cannot rejoin a process group the others have left, so Ray restarts
none of them by itself. When one dies, or ends with a RankFailure (another rank died or
hung past --collective_timeout_s), the launcher kills every rank and starts the group again
in the same bundles, so on the same nodes, where each rank serves on its first port and
resumes from rank 0's latest checkpoint (the logdir must be one folder for every rank:
shared storage across nodes). The actors reconnect by themselves.
"""

from __future__ import annotations

import dataclasses
import socket
import sys
import time
from typing import Any

from fleetrl.common.extras import MissingExtra
from fleetrl.launch.configs import RayConfig
from fleetrl.launch.ray_hosts import FleetrlLearner
from fleetrl.proto import learner_pb2 as pb

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy
except ImportError as e:  # says which extra brings it
    raise MissingExtra("launch.ray", "ray", e) from e


def ray_options(resources: dict[str, float]) -> dict[str, Any]:
    """Ray's actor options for a resource request such as {"CPU": 1, "GPU": 1, "my_node": 1}."""
    custom = {k: float(v) for k, v in resources.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": float(resources.get("CPU", 0)), "num_gpus": float(resources.get("GPU", 0)),
            "resources": custom}


def _rendezvous_address() -> tuple[str, int]:
    """This node's IP and a port free on it: where the ranks' process group meets."""
    with socket.socket() as s:
        s.bind(("", 0))
        return ray.util.get_node_ip_address(), s.getsockname()[1]


class LearnerGroup:
    def __init__(self, config: RayConfig, token: str | None = None):
        """`token`: the run's own, handed to each rank through Ray (None: the user's own auth)."""
        self.config, self.size, self.token = config, config.learner_ranks, token
        self.resources = config.resources("learner_resources")
        self.placement = None
        if any(self.resources.values()):
            bundle = {k: float(v) for k, v in self.resources.items() if v}
            self.placement = ray.util.placement_group([bundle] * self.size, strategy="PACK")
        self.ranks: list = []
        self.restarts = 0

    @property
    def rank0(self):
        return self.ranks[0]

    def start(self, restarted: bool = False) -> None:
        """Every rank's Ray actor; `restarted`: each serves on its previous port and resumes."""
        env = {}
        if self.size > 1:
            ip, port = ray.get(ray.remote(_rendezvous_address).options(
                num_cpus=0, scheduling_strategy=self._strategy(0)).remote())
            env = {"env_vars": {"MASTER_ADDR": ip, "MASTER_PORT": str(port)}}
        # One learner: Ray restarts its process. Ranks: the launcher restarts them together.
        max_restarts = self.config.learner_max_restarts if self.size == 1 else 0
        self.ranks = [ray.remote(FleetrlLearner).options(
            max_restarts=max_restarts, max_concurrency=4, scheduling_strategy=self._strategy(rank),
            runtime_env=env or None, **ray_options(self.resources),
        ).remote(dataclasses.asdict(dataclasses.replace(self.config.learner, world_size=self.size, rank=rank)),
                 restarted, self.token) for rank in range(self.size)]

    def _strategy(self, rank: int):
        if self.placement is None:  # no resources asked: on this node
            return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        return PlacementGroupSchedulingStrategy(self.placement, placement_group_bundle_index=rank)

    def info(self, timeout_s: float, stop_requested: list[str]) -> list[dict[str, Any]] | None:
        """Every rank's info once each is placed and serving; None if one failed or the wait
        was cut short."""
        infos = []
        for rank, handle in enumerate(self.ranks):
            ref, deadline = handle.info.remote(), time.monotonic() + timeout_s
            while True:
                if stop_requested or time.monotonic() > deadline:
                    print("the learner was not serving in time (are its --learner_resources available on the "
                          "cluster?)" if not stop_requested else f"{stop_requested[0]}: stopping", file=sys.stderr)
                    return None
                ready, _ = ray.wait([ref], timeout=1.0)
                if not ready:
                    continue
                try:
                    infos.append(ray.get(ref))
                    break
                except ray.exceptions.ActorUnavailableError:  # Ray is restarting it: ask again
                    time.sleep(0.5)
                    ref = handle.info.remote()
                except ray.exceptions.RayError as e:
                    print(f"the learner{f' rank {rank}' if self.size > 1 else ''} could not start: {e}",
                          file=sys.stderr)
                    return None
        return infos

    def status(self) -> pb.Status:
        """Rank 0's status: the fleet's counts."""
        return pb.Status.FromString(ray.get(self.rank0.status.remote()))

    def wait(self, timeout_s: float) -> dict[str, Any] | None:
        """Rank 0's summary once the run has ended (every rank ends at the same batch)."""
        return ray.get(self.rank0.wait.remote(timeout_s))

    def stop(self, reason: str) -> None:
        self.rank0.stop.remote(reason)

    def failed_rank(self) -> str | None:
        """Ranks: why the group must restart (a rank died, or ended with a RankFailure); None
        while every rank runs or ended well."""
        if self.size == 1:
            return None
        for rank, handle in enumerate(self.ranks):
            try:
                summary = ray.get(handle.wait.remote(0.0), timeout=30)
            except ray.exceptions.RayError as e:
                return f"learner rank {rank}'s process died ({type(e).__name__})"
            if summary is not None and "RankFailure" in summary.get("error", ""):
                return f"learner rank {rank} lost another rank: {summary['error'].strip().splitlines()[-1]}"
        return None

    def can_restart(self) -> bool:
        limit = self.config.learner_max_restarts
        return limit < 0 or self.restarts < limit

    def restart(self) -> None:
        """Every rank, killed and started again in its bundle, resuming rank 0's checkpoint."""
        self.restarts += 1
        self.kill()
        self.start(restarted=True)

    def kill(self) -> None:
        for handle in self.ranks:  # nothing of theirs stays: not even a process Ray would restart
            ray.kill(handle, no_restart=True)

    def remove(self) -> None:
        self.kill()
        if self.placement is not None:
            ray.util.remove_placement_group(self.placement)
