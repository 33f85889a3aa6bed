"""Shared test fixtures. Tests run against the installed package `fleetrl`, over real gRPC and
real processes; no test module imports another.

- `running_learner(path, **config)`: a context manager serving a real Learner on a free port;
  `serve(**config)` starts one that stops when the test ends.
- `raw_actor(address)`: speaks the protocol message by message, so a test can send anything.
- `wire`: builders of protocol messages (a handshake, a CartPole step).
- `unroll_batch(problem, agent)`: real unrolls through the learner's own inference step.
- `local_run`: starts `launch.local` in its own process and checks nothing is left behind.
- `eventually(condition, timeout_s, what)`: waits for another thread's or process's state.
  A gRPC status or a stream's end reaches the client before the learner's thread has
  necessarily updated everything, so a test reads learner state through this, never once.

Under CI=true a skipped test fails (a missing extra or ../shared fixture hides nothing there).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import queue
import subprocess
import sys
import threading
import time
import types
import uuid

import grpc
import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.inference.env_state_store import build_state_store
from fleetrl.learner.inference.inference_step import InferenceStep, StepRequest
from fleetrl.learner.learner import Learner
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.losses.batch import UnrollBatch
from fleetrl.proto import PROTOCOL_VERSION
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc
from fleetrl.proto.tensors import encode

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


# ----- under CI=true nothing may be missing -----

# CI installs every extra and has ../shared beside its clone: a skip there (a missing extra,
# module or fixture) would hide a test that should have run, so it fails instead.
STRICT = os.environ.get("CI") == "true"


def _failed_for_skipping(report) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, where every extra and fixture must be present: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        _failed_for_skipping(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    report = (yield).get_result()
    if STRICT and report.skipped:  # a module-level importorskip
        _failed_for_skipping(report)


# ----- how `make test` spreads the suite over two workers (`--dist loadgroup`) -----

@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """A file's tests run on one worker, so that a module fixture (a Ray cluster, a wheel's
    virtualenv) is built once and no two Ray tests overlap; the learning runs (slow, not
    `file_fixture`) are scheduled one by one instead. The slow tests go first: started
    last, a 5-minute run leaves the other worker idle at the end."""
    for item in items:
        if not item.get_closest_marker("slow") or item.get_closest_marker("file_fixture"):
            item.add_marker(pytest.mark.xdist_group(item.path.name))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: slow first
    # Tests that must run in a network namespace of loopback only (a Ray cluster's) run there,
    # in a pytest of their own that one driver test starts: here, only the driver is kept.
    inside = os.environ.get(LOOPBACK_NETNS) == "1"
    away = [i for i in items if i.get_closest_marker("loopback_netns" if not inside else "netns_driver")]
    if away:
        config.hook.pytest_deselected(items=away)
        items[:] = [i for i in items if i not in away]


# Set in the pytest that runs inside a network namespace of loopback only (tests/test_launch_ray.py).
LOOPBACK_NETNS = "FLEETRL_LOOPBACK_NETNS"

_GROUPS_LOST = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)  # after xdist has named each test's group in its node id
def pytest_collection_finish(session):
    session.config.stash[_GROUPS_LOST] = getattr(session.config.option, "loadgroup", False) and any(
        "@" not in item.nodeid for item in session.items if item.get_closest_marker("xdist_group"))


@pytest.fixture(autouse=True)
def _groups_kept(request):
    """Fails every test of a `--dist loadgroup` run whose groups were lost: two Ray tests would
    share one cluster, and module fixtures be built on both workers, with no other sign but
    odd failures. (An error raised in a worker's hook does not reach the terminal.)"""
    if request.config.stash.get(_GROUPS_LOST, False):
        pytest.fail("pytest-xdist's --dist loadgroup lost the tests' groups, as it does on pytest 9.2 "
                    "(pytest-xdist#1386): install pyproject's pinned pytest (make install)")


def _eventually(condition, timeout_s: float, what: str, poll_s: float = 0.05):
    """`condition()`'s first truthy value within `timeout_s`; fails naming `what` otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        if value := condition():
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(poll_s)


@pytest.fixture
def eventually():
    return _eventually


@pytest.fixture(autouse=True)
def _small_torch():
    torch.set_num_threads(1)
    yield


@pytest.fixture
def python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return REPO_ROOT


# ----- a learner in this process -----

@contextlib.contextmanager
def _running_learner(path, **overrides):
    config = LearnerConfig(bind="127.0.0.1:0", logdir=str(path / "logs"), summary_interval_s=0.5, **overrides)
    learner = Learner(config)
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    try:
        yield learner
    finally:
        learner.finish("test over")
        thread.join(timeout=30)
        assert not thread.is_alive(), "the learner did not stop"


@pytest.fixture
def running_learner():
    return _running_learner


@pytest.fixture
def serve(tmp_path):
    """`serve(**config)` starts a learner that stops when the test ends. Ask for it before
    `raw_actor`, so that the actors' streams close first and the learner stops at once."""
    with contextlib.ExitStack() as stack:
        count = iter(range(1000))
        yield lambda **config: stack.enter_context(_running_learner(tmp_path / f"learner-{next(count)}", **config))


class RawActor:
    """Speaks the protocol message by message, so tests can send anything."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.LearnerStub(self.channel)
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._responses = self.stub.Stream(iter(self._requests.get, None))

    def send(self, message: pb.ActorMessage) -> pb.LearnerMessage:
        self._requests.put(message)
        return next(self._responses)

    def close(self):
        self._requests.put(None)
        self._responses.cancel()
        self.channel.close()


@pytest.fixture
def raw_actor():
    opened = []

    def open_(address: str) -> RawActor:
        opened.append(RawActor(address))
        return opened[-1]

    yield open_
    for actor in opened:
        actor.close()


def handshake(actor_id="a", num_envs=2, problem="cartpole", obs_shape=(4,), obs_dtype=np.float32, action_shape=(),
              extra_specs=()) -> pb.ActorMessage:
    return pb.ActorMessage(handshake=pb.Handshake(
        protocol_version=PROTOCOL_VERSION, problem=problem, actor_id=actor_id, num_envs=num_envs,
        observation_spec=[pb.TensorSpec(name="observation", dtype=pb.FLOAT32 if obs_dtype == np.float32 else pb.FLOAT64,
                                        shape=list(obs_shape))],
        action_spec=[pb.TensorSpec(name="action", dtype=pb.INT64, shape=list(action_shape))],
        extra_spec=list(extra_specs),
    ))


def cartpole_step(num_envs=2, run_ids=None, obs=None, rewards=None, env_indices=None, extras=None) -> pb.ActorMessage:
    env_indices = list(range(num_envs)) if env_indices is None else env_indices
    n = len(env_indices)
    obs = np.zeros((n, 4), np.float32) if obs is None else obs
    return pb.ActorMessage(step=pb.Step(
        env_indices=env_indices, run_ids=run_ids or [i + 1 for i in range(n)],
        observations=[obs if isinstance(obs, pb.Tensor) else encode("observation", obs)],
        rewards=[1.0] * n if rewards is None else rewards, terminated=[False] * n, truncated=[False] * n,
        extras=[encode(name, value) for name, value in (extras or {}).items()],
    ))


@pytest.fixture
def wire():
    """Protocol messages for a CartPole learner: `wire.handshake(...)`, `wire.cartpole_step(...)`."""
    return types.SimpleNamespace(handshake=handshake, cartpole_step=cartpole_step)


# ----- unrolls without gRPC -----

@pytest.fixture
def unroll_batch():
    def make(problem, agent, unroll_length=5, num_envs=8, observe=None) -> UnrollBatch:
        """Real unrolls of random steps through the learner's own inference step; CartPole-shaped
        observations, or `observe(rng, num_envs)`'s."""
        store = build_state_store(problem, agent, unroll_length, torch.device("cpu"))
        unrolls = []
        inference = InferenceStep(problem, agent, PolicyVersion(), store, lambda u: unrolls.append(u) or True,
                                  torch.device("cpu"))
        slots, run_ids = store.allocate(num_envs), np.arange(1, num_envs + 1, dtype=np.uint64)
        rng = np.random.default_rng(0)
        for _ in range(unroll_length + 1):
            ended = rng.uniform(size=num_envs) < 0.1
            observation = observe(rng, num_envs) if observe else \
                {"observation": rng.normal(size=(num_envs, 4)).astype(np.float32)}
            inference([StepRequest(slots=slots, run_ids=run_ids, observation=observation, extras={},
                                   reward=np.ones(num_envs, np.float32), terminated=ended,
                                   truncated=np.zeros(num_envs, bool))])
        return UnrollBatch.collate(unrolls)

    return make


# ----- launch.local in its own process -----

class LocalRuns:
    """Every launcher started here carries a unique environment tag that its children
    inherit, so `finish` can check that no process of the run is left behind."""

    @staticmethod
    def processes_tagged(tag: str) -> list[int]:
        found = []
        for proc in pathlib.Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if f"FLEETRL_TEST_TAG={tag}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                        found.append(int(proc.name))
                except OSError:
                    pass
        return found

    def start(self, logdir, *flags, pythonpath=None, cwd=None) -> tuple[subprocess.Popen, str]:
        tag = uuid.uuid4().hex
        env = {**os.environ, "FLEETRL_TEST_TAG": tag, "PYTHONUNBUFFERED": "1"}
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
        process = subprocess.Popen(
            [sys.executable, "-m", "fleetrl.launch.local", f"--logdir={logdir}", "--progress_interval_s=0.5", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd or REPO_ROOT)
        return process, tag

    def finish(self, process: subprocess.Popen, tag: str, timeout: float = 600) -> tuple[int, str]:
        output, _ = process.communicate(timeout=timeout)
        deadline = time.monotonic() + 10
        while self.processes_tagged(tag) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert self.processes_tagged(tag) == [], f"processes left behind:\n{output}"
        return process.returncode, output

    def train_to_target(self, logdir, *flags, **kwargs) -> dict:
        """Runs launch.local, checks it exited 0 having reached --target_mean_return; returns summary.json."""
        process, tag = self.start(logdir, *flags, **kwargs)
        code, output = self.finish(process, tag)
        assert code == 0, output
        summary = json.loads((pathlib.Path(logdir) / "summary.json").read_text())
        assert summary["target_reached"], output
        return summary

    @staticmethod
    def read_scalars(logdir) -> dict[str, list[float]]:
        events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
        events.Reload()
        return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.fixture
def local_run() -> LocalRuns:
    return LocalRuns()


# ----- LIBERO's demonstration files -----

def _write_libero_demos(path, instruction: str = "put the bowl on the plate", lengths=(7, 5), size: int = 16,
                        drop: str | None = None) -> str:
    """A tiny demonstration file in LIBERO's layout (robomimic's HDF5), random content."""
    import h5py

    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        if instruction:
            data.attrs["problem_info"] = json.dumps({"language_instruction": instruction})
        for i, length in enumerate(lengths):
            demo = data.create_group(f"demo_{i}")
            demo["actions"] = np.clip(rng.normal(0, 0.5, (length, 7)), -1, 1)
            obs = demo.create_group("obs")
            obs["agentview_rgb"] = rng.integers(0, 256, (length, size, size, 3), dtype=np.uint8)
            obs["eye_in_hand_rgb"] = rng.integers(0, 256, (length, size, size, 3), dtype=np.uint8)
            for key, width in (("ee_pos", 3), ("ee_ori", 3), ("gripper_states", 2), ("joint_states", 7)):
                obs[key] = rng.normal(size=(length, width))
            if drop:
                del obs[drop]
    return str(path)


@pytest.fixture
def write_demo_file():
    return _write_libero_demos


@pytest.fixture(scope="module")
def tiny_model_cache(tmp_path_factory):
    """FLEETRL_CACHE, where tiny models are built, set to a folder of the requesting module's
    own for its tests, then restored."""
    old = os.environ.get("FLEETRL_CACHE")
    os.environ["FLEETRL_CACHE"] = str(tmp_path_factory.mktemp("models"))
    yield os.environ["FLEETRL_CACHE"]
    if old is None:
        del os.environ["FLEETRL_CACHE"]
    else:
        os.environ["FLEETRL_CACHE"] = old
