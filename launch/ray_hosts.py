"""The processes `launch.ray` places on a Ray cluster: one learner and the actors.

Each is a Ray actor whose process *is* a fleetrl learner or actor, running the same code
as `launch.learner` and `launch.actor`. Ray only places, starts and restarts them; the
training data flows over fleetrl's own gRPC stream. Configs arrive as plain dicts of
strings and numbers (Ray sends those without pickle) and become the usual dataclasses.

An actor starts acting in its constructor, so when Ray restarts a crashed one (its
`max_restarts`), the new process simply connects to the learner again. A restarted
learner resumes from its logdir's latest checkpoint (the Learner does that) and serves on
the port its first process had, which its actors keep calling: the launcher keeps it on
the same node, and the port is kept in `<logdir>/learner_port` (rank r's in
`learner_port.rank<r>`). Learner ranks are restarted together by the launcher
(`ray_learner_group`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import tempfile
import threading
import traceback
from typing import Any

from fleetrl.actor.actor import Actor, ActorError
from fleetrl.actor.config import ActorConfig
from fleetrl.common.extras import MissingExtra
from fleetrl.common.files import atomic_write_text
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.learner import Learner

try:
    import ray
except ImportError as e:  # says which extra brings it
    raise MissingExtra("launch.ray", "ray", e) from e


@contextlib.contextmanager
def _token_file(token: str | None):
    """The run's token (handed over by Ray, never on a command line) in a file only this
    user can read, for as long as the learner or actor reads it in; None without one."""
    if token is None:
        yield None
        return
    fd, path = tempfile.mkstemp(prefix="fleetrl-token-")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(token)
        yield path
    finally:
        os.remove(path)


WILDCARDS = ("0.0.0.0", "[::]", "")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _log_lines(path: str | None = None) -> None:
    """This process's log lines, at INFO: to stderr (Ray keeps it in its session logs and,
    with --log_to_driver, prints it in the launcher's terminal) and to `path` (the learner's
    log in its logdir, as launch.local writes it). logging.basicConfig would do nothing here:
    Ray's worker has given the root logger handlers of its own."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if path is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handlers.append(logging.FileHandler(path))
    for handler in handlers:
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)


def _node() -> dict[str, Any]:
    context = ray.get_runtime_context()
    return {"pid": os.getpid(), "node_id": context.get_node_id(), "ip": ray.util.get_node_ip_address()}


class FleetrlLearner:
    """The learner, serving on all interfaces of its node; `address()` is where actors reach it."""

    def __init__(self, config: dict[str, Any], restarted: bool = False, token: str | None = None):
        """`restarted`: the launcher started it again (learner ranks restart as a group);
        else it is restarted when Ray reconstructed its actor. `token`: the run's own, which
        the launcher made when the user gave neither a token nor client certificates."""
        learner_config = LearnerConfig(**config)
        rank = learner_config.rank
        _log_lines(os.path.join(learner_config.logdir, "logs", "learner" + (f".rank{rank}" if rank else "") + ".log"))
        port_file = os.path.join(learner_config.logdir, "learner_port" + (f".rank{rank}" if rank else ""))
        host, port = learner_config.bind.rsplit(":", 1)
        self.restarted = restarted or ray.get_runtime_context().was_current_actor_reconstructed
        if self.restarted and port == "0" and os.path.exists(port_file):
            with open(port_file) as f:  # the actors call the first process's port
                learner_config = dataclasses.replace(learner_config, bind=f"{host}:{f.read().strip()}")
        with _token_file(token) as path:
            if path is not None:
                learner_config = dataclasses.replace(learner_config, auth_token_file=path)
            self.learner = Learner(learner_config)
        self.resumed_steps = self.learner.policy.version
        atomic_write_text(port_file, self.learner.address.rsplit(":", 1)[1])
        self._summary: dict[str, Any] | None = None
        self._error: str | None = None
        self._thread = threading.Thread(target=self._run, name="learner", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._summary = dataclasses.asdict(self.learner.run())
        except BaseException:  # reported to the launcher, which ends the run
            self._error = traceback.format_exc()

    def info(self) -> dict[str, Any]:
        host, port = self.learner.address.rsplit(":", 1)
        if host in WILDCARDS:  # every interface: actors dial the node's address
            host = ray.util.get_node_ip_address()
        return {**_node(), "address": f"{host}:{port}", "logdir": self.learner.config.logdir,
                "rank": self.learner.config.rank,
                "restarted": self.restarted, "resumed_from": self.learner.resumed_from,
                "resumed_steps": self.resumed_steps}

    def status(self) -> bytes:
        """The GetStatus reply, as protobuf bytes."""
        return self.learner.status().SerializeToString()

    def wait(self, timeout_s: float) -> dict[str, Any] | None:
        """The run's summary once it has ended ({"error": ...} if it failed), else None."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return None
        return self._summary if self._error is None else {"error": self._error}

    def stop(self, reason: str) -> None:
        self.learner.finish(reason)


class FleetrlActor:
    """One fleetrl actor (train or eval), acting from the moment it is built."""

    def __init__(self, config: dict[str, Any], token: str | None = None):
        _log_lines()
        self.config = ActorConfig(**config)
        self._token = token
        self._state, self._error = "running", ""
        self._actor: Actor | None = None
        self._thread = threading.Thread(target=self._run, name="actor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with _token_file(self._token) as path:  # read when the actor is built
                config = self.config if path is None else dataclasses.replace(self.config, auth_token_file=path)
                self._actor = Actor(config)
            self._actor.run()
            self._state = "finished"
        except ActorError as e:
            self._state, self._error = "failed", str(e)
        except BaseException:
            self._state, self._error = "failed", traceback.format_exc()

    def info(self) -> dict[str, Any]:
        steps = self._actor.steps_sent if self._actor is not None else 0
        return {**_node(), "state": self._state, "error": self._error, "steps": steps,
                "actor_id": self._actor.actor_id if self._actor is not None else ""}
