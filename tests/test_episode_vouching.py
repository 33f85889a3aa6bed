"""Episode statistics the learner can vouch for (learner/accounting/episode_accounts.py, metric_rules.py).

The learner sums each train env's rewards and steps itself, counts episodes with its own
figures, and takes only declared, bounded metrics. The hostile cases come from a client
built from proto/learner.proto alone (raw bytes, no fleetrl helper), against a learner that
healthy actors train with: each is refused or neutralized, the run does not end, its curves
stay finite, and its episode count is the healthy actors' own.
"""

import itertools
import math
import sys
import textwrap
import threading

import grpc
import numpy as np
import pytest

from fleetrl.actor.actor import Actor
from fleetrl.actor.config import ActorConfig
from fleetrl.actor.episode_tracker import EpisodeTracker
from fleetrl.learner.accounting.episode_accounts import EpisodeAccounts, vouch
from fleetrl.learner.accounting.metric_rules import UNDECLARED_SLOTS, MetricRules
from fleetrl.learner.transport.wire_messages import Episode
from fleetrl.problems.registry import load_problem
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc
from fleetrl.proto.tensors import WireError

# ----- the learner's own account, against the actor's -----


def test_the_learners_accounts_match_the_actors_tracker_on_random_streams_with_chunk_rewards():
    rng = np.random.default_rng(0)
    num_envs = 6
    tracker, accounts = EpisodeTracker(num_envs), EpisodeAccounts()
    slots = np.arange(10, 10 + num_envs)  # any slots: accounts follow them
    run_ids = rng.integers(1, 2**63, num_envs).astype(np.uint64)
    zeros = np.zeros(num_envs, bool)
    accounts.step(slots, run_ids, np.zeros(num_envs, np.float32), zeros)  # the resets' step: no tracker update
    reported, own = [], []
    for _ in range(400):
        # A chunk step's reward is the sum of its actions' float32 rewards.
        rewards = rng.normal(size=(num_envs, 4)).astype(np.float32).sum(-1, dtype=np.float32) * 7.3
        terminated, truncated = rng.random(num_envs) < 0.1, rng.random(num_envs) < 0.03
        finished = tracker.update(rewards.astype(np.float64), terminated, truncated, {})
        wire_rewards = rewards.astype(np.float32)  # what crosses the wire
        ended = accounts.step(slots, run_ids, wire_rewards, terminated | truncated)
        reports = [Episode(e.env_index, e.env_index, dict(e.metrics), "train", None, {}, None) for e in finished]
        verdict = vouch(ended, reports, np.arange(num_envs))
        assert not verdict.disputes and verdict.unvouched == 0, verdict
        reported += [(e.env_index, e.metrics["return"], e.metrics["length"]) for e in finished]
        own += [(int(row), metrics["return"], metrics["length"])
                for row, (_, metrics) in zip(ended.rows, verdict.counted)]
    assert len(own) > 50
    assert [(e, n) for e, _, n in own] == [(e, n) for e, _, n in reported]
    np.testing.assert_allclose([r for _, r, _ in own], [r for _, r, _ in reported], rtol=1e-5, atol=1e-5)


def test_an_account_follows_its_run_id_to_new_slots_and_a_mid_episode_join_is_not_vouched():
    accounts = EpisodeAccounts()
    one = np.array([5], np.uint64)
    never, done = np.zeros(1, bool), np.ones(1, bool)
    accounts.step(np.array([0]), one, np.zeros(1, np.float32), never)  # the reset
    accounts.step(np.array([0]), one, np.ones(1, np.float32), never)
    accounts.release(np.array([0]))  # the stream broke; the actor reconnects on other slots
    ended = accounts.step(np.array([3]), one, np.ones(1, np.float32), done)
    assert (ended.returns.tolist(), ended.lengths.tolist(), ended.whole.tolist()) == ([2.0], [2], [False])
    report = Episode(0, 0, {"return": 2.0, "length": 2.0}, "train", None, {}, None)
    assert vouch(ended, [report], np.array([0])).counted == [("train", {"return": 2.0, "length": 2.0})]

    # A learner that never saw this env's reset (it restarted mid-episode) sees a shorter episode.
    fresh = EpisodeAccounts()
    fresh.step(np.array([0]), one, np.ones(1, np.float32), never)  # taken as the reset
    ended = fresh.step(np.array([0]), one, np.ones(1, np.float32), done)
    verdict = vouch(ended, [Episode(0, 0, {"return": 9.0, "length": 9.0}, "train", None, {}, None)], np.array([0]))
    assert (verdict.counted, verdict.unvouched) == ([], 1)
    # Its next episode the learner saw whole: a false claim there is a dispute, counted at the learner's figures.
    fresh.step(np.array([0]), one, np.zeros(1, np.float32), never)
    ended = fresh.step(np.array([0]), one, np.ones(1, np.float32), done)
    verdict = vouch(ended, [Episode(0, 0, {"return": 500.0, "length": 1.0, "success": 1.0}, "train", None, {}, None)],
                    np.array([0]))
    assert verdict.counted == [("train", {"return": 1.0, "length": 1.0, "success": 1.0})]
    assert len(verdict.disputes) == 1 and "500" in verdict.disputes[0]


# ----- declared metrics -----


def test_declared_metrics_refuse_other_names_long_names_and_values_out_of_bound():
    rules = MetricRules("grid", ("success",), ("val/success",), bound=100.0)
    rules.check(0, {"return": 3.0, "length": 2.0, "success": 1.0}, evaluating=False)
    rules.check(0, {"val/success": 1.0}, evaluating=True)
    cases = [({"val/success": 1.0}, False, "only eval episodes"),
             ({"sucess": 1.0}, False, "does not declare"),
             ({"x" * 2**20: 1.0}, False, "1,048,576 bytes"),
             ({"return": 1e3}, False, "at most 100"),
             ({"return": math.nan}, False, "finite")]
    for metrics, evaluating, message in cases:
        with pytest.raises(WireError, match=message):
            rules.check(3, metrics, evaluating)


def test_a_problem_that_declares_nothing_keeps_its_first_metrics_and_refuses_more():
    rules = MetricRules("mine", None)
    rules.check(0, {"return": 1.0, "accuracy": 0.5}, evaluating=False)
    for i in range(UNDECLARED_SLOTS - 1):
        rules.check(0, {f"m{i}": 1.0}, evaluating=False)
    rules.check(0, {"accuracy": 0.7, "m0": 1.0}, evaluating=False)  # names already taken stay taken
    with pytest.raises(WireError, match="declare the names in Problem.episode_metric_names"):
        rules.check(0, {"one_too_many": 1.0}, evaluating=False)


def test_built_in_problems_declare_what_their_episodes_report():
    assert load_problem("cartpole").episode_metric_names() == ()
    assert load_problem("gym_cards/numberline").episode_metric_names() == ("success",)
    assert "val_unseen/SPL" in load_problem("r2r").eval_metric_names()


# ----- hostile clients from the proto alone, against a learner healthy actors train with -----


def _tensor(name: str, array: np.ndarray) -> pb.Tensor:
    dtypes = {np.dtype(np.float32): pb.FLOAT32, np.dtype(np.int64): pb.INT64}
    return pb.Tensor(name=name, dtype=dtypes[array.dtype], shape=list(array.shape), data=array.tobytes())


_RUN_IDS = itertools.count(7_000)


class ProtoClient:
    """A CartPole client from learner.proto alone: GetRunInfo, a handshake of its specs, steps."""

    def __init__(self, address: str, actor_id: str, num_envs: int):
        self.channel = grpc.insecure_channel(address)
        stub = pb_grpc.LearnerStub(self.channel)
        self.info = stub.GetRunInfo(pb.RunInfoRequest())
        self.num_envs, self.sequence = num_envs, 0
        self.run_ids = [next(_RUN_IDS) for _ in range(num_envs)]
        self._requests = []
        self._event = threading.Condition()
        self._responses = stub.Stream(self._generate())
        self.send(pb.ActorMessage(handshake=pb.Handshake(
            protocol_version=self.info.protocol_version, problem=self.info.problem, actor_id=actor_id,
            num_envs=num_envs, observation_spec=self.info.observation_spec, action_spec=self.info.action_spec,
            extra_spec=self.info.extra_spec)))

    def _generate(self):
        while True:
            with self._event:
                self._event.wait_for(lambda: self._requests)
                message = self._requests.pop(0)
            if message is None:
                return
            yield message

    def send(self, message: pb.ActorMessage) -> pb.LearnerMessage:
        with self._event:
            self._requests.append(message)
            self._event.notify()
        return next(self._responses)

    def step(self, rewards=0.0, done=(), episodes=()) -> pb.LearnerMessage:
        n = self.num_envs
        self.sequence += 1
        terminated = [i in done for i in range(n)]
        return self.send(pb.ActorMessage(step=pb.Step(
            env_indices=range(n), run_ids=self.run_ids, rewards=[rewards] * n, terminated=terminated,
            truncated=[False] * n, observations=[_tensor("observation", np.zeros((n, 4), np.float32))],
            finished_episodes=episodes, sequence=self.sequence)))

    def close(self):
        with self._event:
            self._requests.append(None)
            self._event.notify()
        self.channel.close()


def _refused(client: ProtoClient, match: str, **step) -> None:
    with pytest.raises(grpc.RpcError) as error:
        client.step(**step)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and match in error.value.details(), (
        error.value.details())
    client.close()


def test_hostile_episode_reports_neither_end_the_run_nor_reach_its_curves(serve, eventually):
    learner = serve(problem="cartpole", target_mean_return=475.0, return_window=100, inference_timeout_ms=2)
    address = learner.address
    info = ProtoClient(address, "reader", 1)
    assert list(info.info.episode_metrics) == ["return", "length"] and info.info.metric_bound == 1e9
    info.close()
    healthy = Actor(ActorConfig(learner_address=address, num_envs=8, actor_id="healthy", seed=1))
    acting = threading.Thread(target=healthy.run, kwargs={"max_steps": 300})
    acting.start()

    hijack = ProtoClient(address, "hijack", 100)  # 100 finished episodes of return 500 in its first step
    hijack.step(done=range(100), episodes=[pb.EpisodeStats(env_index=i, metrics={"return": 500.0, "length": 500.0})
                                           for i in range(100)])
    # Then real one-step episodes of reward 1 (the first step was their reset), claimed as 500.
    hijack.step(rewards=1.0, done=range(100),
                episodes=[pb.EpisodeStats(env_index=i, metrics={"return": 500.0, "length": 1.0}) for i in range(100)])
    hijack.close()
    _refused(ProtoClient(address, "many", 1), "at most one per env", done=[0],
             episodes=[pb.EpisodeStats(env_index=0, metrics={"return": 500.0})] * 100)
    _refused(ProtoClient(address, "not-done", 1), "neither terminated nor truncated",
             episodes=[pb.EpisodeStats(env_index=0, metrics={"return": 500.0})] * 1)
    _refused(ProtoClient(address, "not-done-500", 1), "at most one per env",
             episodes=[pb.EpisodeStats(env_index=0, metrics={"return": 500.0})] * 500)
    huge = ProtoClient(address, "huge", 2)
    huge.step()
    _refused(huge, "at most 1e+09 in magnitude", rewards=1.0, done=[0, 1],
             episodes=[pb.EpisodeStats(env_index=i, metrics={"return": 1.7e308, "length": 1.0}) for i in range(2)])
    named = ProtoClient(address, "named", 1)
    named.step()
    _refused(named, "which problem cartpole does not declare", rewards=1.0, done=[0],
             episodes=[pb.EpisodeStats(env_index=0, metrics={f"m{i}": 1.0 for i in range(2000)})])
    long_name = ProtoClient(address, "long", 1)
    long_name.step()
    _refused(long_name, "names are 1 to 128 bytes", rewards=1.0, done=[0],
             episodes=[pb.EpisodeStats(env_index=0, metrics={"x" * 2**20: 1.0})])
    _refused(ProtoClient(address, "big-reward", 1), "beyond the problem's bound", rewards=3e38)

    acting.join(timeout=120)
    assert not acting.is_alive() and healthy.steps_sent == 300
    status = learner.status()
    assert not status.finished, status.finished_reason
    # The hijacker's first claims were of episodes the learner never saw begin; its second were
    # real one-step episodes, counted at their real return of 1.
    assert (status.unvouched_episodes, status.disputed_episodes) == (100, 100)
    assert status.episodes == healthy.episodes_sent + 100
    assert math.isfinite(status.mean_episode_return) and status.mean_episode_return < 100


BUGGY_PROBLEM = '''
import gymnasium as gym
import numpy as np

from fleetrl.agents import MLPAgent
from fleetrl.problems.base import Problem


class StaleReportEnv(gym.Env):
    """Episodes of 4 steps of reward 1. Two bugs: after an autoreset the stale done flag ends the
    next episode at its first step, and the reported return is never reset (a running total)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.total, self.stale_done = 0.0, False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        self.total += 1.0
        terminated = self.t >= 4 or self.stale_done
        self.stale_done = terminated and not self.stale_done
        return np.zeros(1, np.float32), 1.0, terminated, False, {"episode_return": self.total}


class StaleReportProblem(Problem):
    name = "stale_report"

    def make_env(self):
        return StaleReportEnv()

    def make_agent(self):
        return MLPAgent(1, 2, (8,))

    def episode_metrics(self, final_info):
        return {"return": final_info["episode_return"]}  # the bug: a running total, not this episode's
'''


def test_a_user_env_that_double_reports_after_an_autoreset_is_counted_at_the_learners_figures(
        tmp_path, monkeypatch, serve, caplog):
    (tmp_path / "buggy_user_env.py").write_text(textwrap.dedent(BUGGY_PROBLEM))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "buggy_user_env", raising=False)
    # The reported running totals pass 6 within a few episodes; the real returns are 4 and 1.
    learner = serve(problem="buggy_user_env:StaleReportProblem", target_mean_return=6.0, return_window=8)
    actor = Actor(ActorConfig(learner_address=learner.address, problem="buggy_user_env:StaleReportProblem",
                              num_envs=4, actor_id="buggy"))
    with caplog.at_level("WARNING", logger="fleetrl.learner.transport.step_intake"):
        actor.run(max_steps=200)
    status = learner.status()
    assert not status.finished, status.finished_reason
    assert status.episodes == actor.episodes_sent > 50
    # Episodes of 4 and 1 steps alternate, in step on every env: the last 8 are 4 of each.
    assert status.mean_episode_return == pytest.approx(2.5)
    # Every report but each env's first (a running total of 4 is that episode's return) is disputed.
    assert status.disputed_episodes == actor.episodes_sent - 4 and status.unvouched_episodes == 0
    # Dozens of disputes within seconds, one line: the first stale total (5 for a 1-step episode).
    (line,) = [r.getMessage() for r in caplog.records if "differ from the steps" in r.getMessage()]
    assert line.startswith("actor 'buggy' reports") and "reported return 5.0, length 1.0; the learner's: return 1," \
        in line, line


def test_the_soaks_hostile_client_has_every_kind_of_damage_refused(serve, eventually):
    from fleetrl.bench.hostile_client import HostileClient

    learner = serve(problem="cartpole")
    client = HostileClient(learner.address, messages_per_s=100.0)
    client.start()
    eventually(lambda: sum(client.tally().values()) >= 27, 60, "27 answers")  # each of the 9 kinds 3 times
    client.stop()
    tally = client.tally()
    assert set(tally) == {"rejected"}, tally
    assert learner.status().episodes == 0
