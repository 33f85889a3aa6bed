"""The soak run's train actors: real `Actor`s in their own processes, whose episode
counters live in shared memory, so the soak can read them after a SIGKILL and can pause
them all at a point where none has a step in flight.

The pause point is the `episodes_sent` setter, which the actor runs right after each
answer and before it steps its envs again. With one group of envs (the default) an actor
waiting there has no step at the learner, so a snapshot taken while every actor waits
sees the learner's count and the actors' counters at one consistent moment.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.sharedctypes
import os
import signal
import sys
import time

import numpy as np

from fleetrl.actor.actor import Actor
from fleetrl.actor.config import ActorConfig
from fleetrl.bench.soak_checks import ActorCounts

_STEPS, _ANSWERED, _FINISHED, _PAUSED = range(4)
_SPAWN = multiprocessing.get_context("spawn")  # a fresh interpreter, as a real actor process is


class CountedActor(Actor):
    """The real Actor; its counters are mirrored into `counters`, and it waits while `pause` is set."""

    def __init__(self, config: ActorConfig, counters, pause):
        self._counters, self._pause = counters, pause  # before Actor.__init__, which sets the counters
        super().__init__(config)

    @property
    def steps_sent(self) -> int:
        return self._counters[_STEPS]

    @steps_sent.setter
    def steps_sent(self, value: int) -> None:
        self._counters[_STEPS] = value

    @property
    def episodes_finished(self) -> int:
        return self._counters[_FINISHED]

    @episodes_finished.setter
    def episodes_finished(self, value: int) -> None:
        self._counters[_FINISHED] = value

    @property
    def episodes_sent(self) -> int:
        return self._counters[_ANSWERED]

    @episodes_sent.setter
    def episodes_sent(self, value: int) -> None:
        self._counters[_ANSWERED] = value
        while self._pause.value:
            self._counters[_PAUSED] = self._pause.value
            time.sleep(0.001)


def _run_actor(config: ActorConfig, counters, pause, log_path: str) -> None:
    with open(log_path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    CountedActor(config, counters, pause).run()


class TrainActors:
    """`num_actors` train actors; `kill_one` SIGKILLs one and starts its replacement (new id, new seed)."""

    def __init__(self, address: str, num_actors: int, num_envs: int, log_dir: str, seed: int,
                 max_reconnect_s: float):
        self._address, self._num_envs, self._log_dir = address, num_envs, log_dir
        self._max_reconnect_s = max_reconnect_s
        self._rng = np.random.default_rng(seed)
        self._pause = _SPAWN.RawValue("q", 0)
        self._pauses = 0
        self._started = 0
        self._processes: dict[str, multiprocessing.Process] = {}
        self._counters: dict[str, multiprocessing.sharedctypes.SynchronizedArray] = {}
        self.kills = 0
        for _ in range(num_actors):
            self._start()

    def _start(self) -> None:
        name = f"soak-actor-{self._started}"
        config = ActorConfig(learner_address=self._address, problem="cartpole", num_envs=self._num_envs,
                             actor_id=name, seed=1000 * self._started, max_reconnect_s=self._max_reconnect_s)
        counters = _SPAWN.RawArray("q", 4)
        process = _SPAWN.Process(target=_run_actor, name=name, daemon=True,
                                 args=(config, counters, self._pause, os.path.join(self._log_dir, f"{name}.log")))
        process.start()
        self._processes[name], self._counters[name] = process, counters
        self._started += 1

    def live(self) -> list[str]:
        return [name for name, p in self._processes.items() if p.is_alive()]

    def kill_one(self) -> str:
        name = str(self._rng.choice(self.live()))
        process = self._processes[name]
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        self.kills += 1
        self._start()
        return name

    def counts(self) -> dict[str, ActorCounts]:
        return {name: ActorCounts(int(c[_ANSWERED]), int(c[_FINISHED]), self._processes[name].is_alive())
                for name, c in self._counters.items()}

    def pause(self, timeout_s: float) -> bool:
        """Holds every live actor at its pause point; True when all got there within
        `timeout_s` (False when the learner is not answering). Call `resume` either way."""
        self._pauses += 1
        self._pause.value = self._pauses
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # One never answered yet has only its first step, without episodes, in flight,
            # and stops at that step's answer.
            if all(c[_PAUSED] == self._pauses or c[_STEPS] == 0
                   for name, c in self._counters.items() if self._processes[name].is_alive()):
                return True
            time.sleep(0.005)
        return False

    def resume(self) -> None:
        self._pause.value = 0

    def stop(self, timeout_s: float = 30.0) -> list[int | None]:
        """Waits for the actors to end (they do once the learner ends the run), then kills what is left;
        returns the exit codes of those that were alive."""
        self.resume()
        alive = [p for p in self._processes.values() if p.is_alive()]
        deadline = time.monotonic() + timeout_s
        for process in alive:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
        return [p.exitcode for p in alive]
