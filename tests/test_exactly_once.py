"""Exactly-once episode stats: streams cut at random points, through a real TCP proxy.

A cut after the learner has read a step but before its answer reaches the actor makes the
actor send that step again on its next stream; the learner must answer it without counting
its finished episodes a second time (Step.sequence).
"""

import socket
import threading
import time

import numpy as np

from fleetrl.actor.actor import Actor
from fleetrl.actor.config import ActorConfig
from fleetrl.learner.accounting.step_ledger import StepLedger
from fleetrl.proto import learner_pb2 as pb


class CuttingProxy:
    """Forwards TCP connections to `target`; `cut()` closes every open one at once, as a
    network fault or a restarted load balancer would."""

    def __init__(self, target: str):
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self._target)
            except OSError:
                return
            with self._lock:
                self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self._lock:
            cut, self._open = self._open, []
        for s in cut:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.cuts += 1

    def close(self) -> None:
        self._listener.close()
        self.cut()


CUTS = 30


def test_each_episode_counts_once_however_often_streams_break(serve):
    learner = serve(problem="cartpole")
    proxy = CuttingProxy(learner.address)
    actors = [Actor(ActorConfig(learner_address=proxy.address, problem="cartpole", num_envs=8, actor_id=f"actor-{i}",
                                seed=i, env_groups=1 + i, max_reconnect_s=30)) for i in range(2)]
    errors = []

    def act(actor: Actor) -> None:
        try:
            actor.run(max_steps=400)
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=act, args=(a,)) for a in actors]
    for thread in threads:
        thread.start()
    rng = np.random.default_rng(0)
    try:
        # Cuts counted in steps, not seconds: each after a random few more answered steps, so
        # the actors' 400 steps see all CUTS of them however fast this machine runs.
        for _ in range(CUTS):
            target = sum(a.steps_sent for a in actors) + rng.integers(1, 8)
            while sum(a.steps_sent for a in actors) < target and any(t.is_alive() for t in threads):
                time.sleep(0.005)
            proxy.cut()
        cuts = proxy.cuts  # close() below cuts once more, after the actors are done
    finally:
        for thread in threads:
            thread.join(timeout=60)
        proxy.close()
    assert not errors, errors
    status: pb.Status = learner.status()
    reported = sum(a.episodes_sent for a in actors)
    assert cuts == CUTS and reported >= 100, (cuts, reported)
    assert all(a.steps_sent == 400 for a in actors)  # every cut came while they were still stepping
    # Some cut came after the learner had taken a step in: that step came again, answered.
    assert status.resent_steps > 0, status
    assert status.episodes == reported, (status.episodes, reported, status.resent_steps)
    # Made but not answered: at most the last step of each group, one episode per env.
    assert all(0 <= a.episodes_finished - a.episodes_sent <= a.config.num_envs for a in actors)


def test_the_ledger_takes_each_number_once_and_forgets_the_longest_silent_group():
    ledger = StepLedger(max_groups=2)
    assert ledger.take(7, 1) and ledger.take(7, 2)
    assert not ledger.take(7, 2) and not ledger.take(7, 1)  # resent
    assert ledger.take(0xFFFF_FFFF_FFFF_FFFF, 1)  # another group, its own numbers
    assert ledger.take(7, 0) and ledger.take(7, 0)  # unnumbered: always new
    ledger.take(7, 3)  # group 7 stepped last, so the third group pushes out the other one
    assert ledger.take(9, 1)
    assert not ledger.take(7, 3) and ledger.take(0xFFFF_FFFF_FFFF_FFFF, 1)
    assert ledger.resent == 3


def test_a_resumed_learner_does_not_count_again_the_steps_its_checkpoint_counted(tmp_path, running_learner, raw_actor,
                                                                                  wire):
    def step(sequence: int, reward: float = 1.0, done: bool = False) -> pb.ActorMessage:
        message = wire.cartpole_step(2, run_ids=[11, 12], rewards=[reward, reward])
        message.step.sequence = sequence
        if done:  # env 0 ends an episode of two steps of reward 1
            message.step.terminated[0] = True
            message.step.finished_episodes.append(pb.EpisodeStats(env_index=0, metrics={"return": 2.0, "length": 2.0}))
        return message

    with running_learner(tmp_path, problem="cartpole") as learner:
        actor = raw_actor(learner.address)
        for message in (wire.handshake(actor_id="a"), step(1, reward=0.0), step(2), step(3, done=True)):
            actor.send(message)
        assert learner.status().episodes == 1
        assert learner.run_state.save() is not None
        actor.close()
    # A crash after the checkpoint, before step 3's answer reached the actor: it resends step 3.
    with running_learner(tmp_path, problem="cartpole") as learner:
        assert learner.status().episodes == 1
        actor = raw_actor(learner.address)
        actor.send(wire.handshake(actor_id="a"))
        actor.send(step(3, done=True))
        assert (learner.status().episodes, learner.status().resent_steps) == (1, 1)
        for message in (step(4, reward=0.0), step(5), step(6, done=True)):  # env 0's next episode: a reset, 2 steps
            actor.send(message)
        status = learner.status()
        assert (status.episodes, status.disputed_episodes, status.unvouched_episodes) == (2, 0, 0)
