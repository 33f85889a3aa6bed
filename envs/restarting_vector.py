"""Envs each in its own process, stepped as a batch, that survive the death of one.

gym's AsyncVectorEnv fails for good when an env's process dies, and the actor with it, all
its other envs included. Over days of training a MuJoCo segfault or an OOM kill of one LIBERO
process is not rare, so actors step their subprocess envs here instead. When an env's process
dies, the env is built again in a new process and reset, and the step (or reset) hands out
that new episode's first observation for it, with reward 0 and neither flag set: the episode
it was playing is lost and never reported. `restarted` names the envs that the last call
restarted, so that the actor gives them new run ids and the learner drops their partial
unrolls, as it does for a reconnect.

Autoreset is next-step, the actor's (fleetrl.envs.vector). An exception an env raises in
Python is not a death: it fails the call with the env's traceback, as a bug should.
Observations and actions cross a local pipe (pickled, on this host only, as in gym's
AsyncVectorEnv); nothing here touches the network.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from fleetrl.envs.space_check import EnvSpaceError, step_observation_error

log = logging.getLogger(__name__)


class EnvProcess:
    """One env in a spawned process (spawn: the actor holds a gRPC channel and torch threads
    that a forked child must not inherit), driven by calls over a pipe."""

    def __init__(self, make_env: Callable[[], gym.Env], index: int):
        context = multiprocessing.get_context("spawn")
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, make_env), daemon=True,
                                       name=f"fleetrl-env-{index}")
        self.process.start()
        child.close()  # the child's end lives in the child only, so its death reads as EOF here

    def send(self, command: str, payload: Any = None) -> bool:
        """False if the process is gone."""
        try:
            self.pipe.send((command, payload))
            return True
        except (BrokenPipeError, ConnectionResetError, EOFError):
            return False

    def receive(self) -> tuple[bool, Any]:
        """(True, the call's result), or (False, None) if the process died before answering."""
        try:
            status, value = self.pipe.recv()
        except (EOFError, ConnectionResetError, BrokenPipeError):
            return False, None
        if status == "space_error":
            raise EnvSpaceError(value)
        if status == "error":
            raise RuntimeError(f"env process {self.process.name} raised:\n{value}")
        return True, value

    def call(self, command: str, payload: Any = None) -> tuple[bool, Any]:
        return self.receive() if self.send(command, payload) else (False, None)

    def exit_code(self) -> int | None:
        self.process.join(timeout=5)
        return self.process.exitcode

    def close(self) -> None:
        if self.process.is_alive() and self.send("close"):
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.pipe.close()


def _serve(pipe: multiprocessing.connection.Connection, make_env: Callable[[], gym.Env]) -> None:
    env = None
    try:
        env = make_env()
        calls = {
            "spaces": lambda _: (env.observation_space, env.action_space, dict(env.metadata), env.render_mode),
            "reset": lambda kwargs: env.reset(**kwargs),
            "step": env.step,
        }
        while True:
            command, payload = pipe.recv()
            if command == "close":
                break
            try:
                pipe.send(("ok", calls[command](payload)))
            except EnvSpaceError as e:  # one line that names the fix: no traceback of this process
                pipe.send(("space_error", str(e)))
            except Exception:  # the env's own error: the parent raises it with this traceback
                pipe.send(("error", traceback.format_exc()))
    except (KeyboardInterrupt, EOFError, ConnectionResetError, BrokenPipeError):  # the actor is ending, or gone
        pass
    except Exception:
        pipe.send(("error", traceback.format_exc()))
    finally:
        if env is not None:
            env.close()
        pipe.close()


class RestartingVectorEnv(gym.vector.VectorEnv):
    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], seed: int = 0):
        """`seed` seeds the resets of restarted envs (an env restarted mid-run cannot replay
        the seeds it was given)."""
        self.env_fns = list(env_fns)
        self.num_envs = len(self.env_fns)
        self.restarted: list[int] = []  # the envs the last call restarted
        self.restarts = 0  # all restarts so far
        self._restart_seeds = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED]))
        self._needs_reset = np.zeros(self.num_envs, bool)
        self._workers = [EnvProcess(fn, i) for i, fn in enumerate(self.env_fns)]
        ok, spaces = self._workers[0].call("spaces")
        if not ok:
            code = self._workers[0].exit_code()
            self.close()
            raise RuntimeError(f"env 0's process died while building its env (exit code {code})")
        self.single_observation_space, self.single_action_space, metadata, self.render_mode = spaces
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = {**metadata, "autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict | None = None):
        seeds = seed if isinstance(seed, list) else [None if seed is None else seed + i for i in range(self.num_envs)]
        if len(seeds) != self.num_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.num_envs} envs")
        self.restarted = []
        sent = [w.send("reset", {"seed": s, "options": options}) for w, s in zip(self._workers, seeds)]
        results = [result if ok else self._restart(i, {"seed": seeds[i], "options": options})
                   for i, (ok, result) in enumerate(self._gather(sent))]
        self._needs_reset[:] = False
        return self._batch_obs([r[0] for r in results]), self._batch_info([r[1] for r in results])

    def step(self, actions):
        self.restarted = []
        sent = []
        for i, (worker, action) in enumerate(zip(self._workers, iterate(self.action_space, actions))):
            sent.append(worker.send("reset", {}) if self._needs_reset[i] else worker.send("step", action))
        observations, rewards, terminated, truncated, infos = [], [], [], [], []
        for i, (ok, result) in enumerate(self._gather(sent)):
            if not ok:
                result = self._restart(i, {"seed": None})
            if len(result) == 2:  # a reset: the step after an episode's end, or a restart
                result = (result[0], 0.0, False, False, result[1])
            obs, reward, term, trunc, info = result
            observations.append(obs)
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
            infos.append(info)
            self._needs_reset[i] = term or trunc
        return (self._batch_obs(observations), np.array(rewards, np.float64), np.array(terminated, bool),
                np.array(truncated, bool), self._batch_info(infos))

    def _gather(self, sent: list[bool]) -> list[tuple[bool, Any]]:
        """Every env's answer, read before any env's error is raised (so no answer is left
        in a pipe); (False, None) for an env whose process died."""
        answers, errors = [], []
        for worker, ok in zip(self._workers, sent):
            try:
                answers.append(worker.receive() if ok else (False, None))
            except RuntimeError as e:
                answers.append((False, None))
                errors.append(e)
        if errors:
            raise errors[0]
        return answers

    def _restart(self, index: int, reset_kwargs: dict) -> tuple[Any, dict]:
        """Builds env `index` again in a new process and resets it; its (obs, info)."""
        code = self._workers[index].exit_code()
        self._workers[index].close()
        log.warning("env %d's process died (exit code %s): starting it again; the episode it played is lost",
                    index, code)
        seed = reset_kwargs.get("seed")
        kwargs = {**reset_kwargs, "seed": int(self._restart_seeds.integers(2**31)) if seed is None else seed}
        self._workers[index] = EnvProcess(self.env_fns[index], index)
        ok, result = self._workers[index].call("reset", kwargs)
        if not ok:
            raise RuntimeError(f"env {index}'s process died again right after a restart "
                               f"(exit code {self._workers[index].exit_code()})")
        self.restarted.append(index)
        self.restarts += 1
        return result

    def _batch_obs(self, observations: list[Any]) -> Any:
        try:
            return concatenate(self.single_observation_space, observations,
                               create_empty_array(self.single_observation_space, self.num_envs))
        except ValueError as e:  # numpy's "wrong shape": say which env and key, as a reset's check does
            error = step_observation_error(self.single_observation_space, observations,
                                           [f"process {w.process.name}" for w in self._workers])
            if error is None:
                raise
            raise error from e

    def _batch_info(self, infos: list[dict]) -> dict[str, Any]:
        batched: dict[str, Any] = {}
        for i, info in enumerate(infos):
            batched = self._add_info(batched, info, i)
        return batched

    def env_pids(self) -> list[int | None]:
        """Each env's process id (the dead-env test kills one)."""
        return [w.process.pid for w in self._workers]

    def close_extras(self, **kwargs: Any) -> None:
        for worker in self._workers:
            worker.close()
