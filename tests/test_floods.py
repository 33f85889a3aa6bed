"""Floods of idle or slow clients: sockets that never speak, streams that never handshake,
and streams that handshake then go silent, while a real actor trains. Each is closed on
time, the actor keeps training, and the learner's threads and memory go back down.

How much a flood slows training is not asserted: a rate measured here moves with whatever
else the machine runs (a 50% bound failed while a learning test ran beside it)."""

import pathlib
import queue
import selectors
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest

from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
HANDSHAKE_TIMEOUT_S, IDLE_TIMEOUT_S = 4, 5


class SilentStream:
    """A stream that sends `first` (if any) and then nothing; records when and how it ended."""

    def __init__(self, stub: pb_grpc.LearnerStub, first: pb.ActorMessage | None = None):
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        if first is not None:
            self._requests.put(first)
        self.opened = time.monotonic()
        self.ended: tuple[float, grpc.StatusCode, str] | None = None
        self.call = stub.Stream(iter(self._requests.get, None))
        self.call.add_done_callback(lambda call: setattr(self, "ended", (
            time.monotonic() - self.opened, call.code(), call.details())))
        if first is not None:  # read the acceptance: the status comes after the messages
            threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        try:
            for _ in self.call:
                pass
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()


def proc_status(pid: int) -> tuple[int, int]:
    """The process's thread count and resident memory in KiB."""
    fields = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0])


def env_steps(stub: pb_grpc.LearnerStub) -> int:
    return stub.GetStatus(pb.StatusRequest(), timeout=10).env_steps


def rate(stub: pb_grpc.LearnerStub, seconds: float) -> float:
    start, began = env_steps(stub), time.monotonic()
    time.sleep(seconds)
    return (env_steps(stub) - start) / (time.monotonic() - began)


@pytest.mark.slow
def test_a_flood_of_idle_clients_is_closed_on_time_while_an_actor_trains_and_leaves_nothing_behind(tmp_path, wire,
                                                                                                  eventually):
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(name: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", *args], cwd=REPO_ROOT, stdout=open(logs / f"{name}.log", "w"),
                                stderr=subprocess.STDOUT)

    learner = start("learner", "fleetrl.launch.learner", "--problem=cartpole", "--bind=127.0.0.1:0",
                    f"--logdir={tmp_path / 'run'}", "--max_actors=160", f"--handshake_timeout_s={HANDSHAKE_TIMEOUT_S}",
                    f"--stream_idle_timeout_s={IDLE_TIMEOUT_S}", "--checkpoint_interval_s=0")
    processes = [learner]
    channels: list[grpc.Channel] = []
    streams: list[SilentStream] = []
    sockets: list[socket.socket] = []
    try:
        address_file = tmp_path / "run" / "learner_address"
        eventually(lambda: address_file.exists() or learner.poll() is not None, 60, "the learner")
        address = address_file.read_text().strip()
        processes.append(start("actor", "fleetrl.launch.actor", f"--learner_address={address}", "--num_envs=16",
                               "--actor_id=real"))
        status_channel = grpc.insecure_channel(address)
        channels.append(status_channel)
        status = pb_grpc.LearnerStub(status_channel)
        eventually(lambda: env_steps(status) > 3000, 120, "the actor to train")
        threads_before, rss_before = proc_status(learner.pid)

        host, port = address.rsplit(":", 1)
        sockets = [socket.create_connection((host, int(port))) for _ in range(500)]
        for _ in range(10):  # ten clients of ten streams each that never say who they are
            channels.append(grpc.insecure_channel(address))
            streams += [SilentStream(pb_grpc.LearnerStub(channels[-1])) for _ in range(10)]
        for i in range(50):  # and fifty that handshake, then go silent
            channels.append(grpc.insecure_channel(address))
            handshake = wire.handshake(actor_id=f"silent-{i}", num_envs=1)
            streams.append(SilentStream(pb_grpc.LearnerStub(channels[-1]), handshake))
        during = rate(status, HANDSHAKE_TIMEOUT_S - 1)  # the actor trains on while the flood is open

        # Every stream ends on time, with the limit it broke named.
        eventually(lambda: all(s.ended for s in streams), 30, "every silent stream to be closed")
        for stream in streams[:100]:
            took, code, details = stream.ended
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "--handshake_timeout_s" in details, stream.ended
            assert took < HANDSHAKE_TIMEOUT_S + 3, stream.ended
        for stream in streams[100:]:  # cancelled by the learner's watchdog, which logs why
            took, code, _ = stream.ended
            assert code == grpc.StatusCode.CANCELLED and IDLE_TIMEOUT_S <= took < IDLE_TIMEOUT_S + 3, stream.ended
        assert (logs / "learner.log").read_text().count(f"sent no step for {IDLE_TIMEOUT_S} s") == 50
        # The sockets that never spoke HTTP/2 are closed by the learner too.
        selector = selectors.DefaultSelector()
        for s in sockets:
            selector.register(s, selectors.EVENT_READ)
        closed, deadline = set(), time.monotonic() + HANDSHAKE_TIMEOUT_S + 10
        while len(closed) < len(sockets) and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=1):
                try:
                    data = key.fileobj.recv(1024)
                except OSError:
                    data = b""
                if not data:
                    closed.add(key.fileobj)
                    selector.unregister(key.fileobj)
        assert len(closed) == len(sockets), f"{len(sockets) - len(closed)} idle sockets still open"

        assert during > 0
        assert processes[1].poll() is None, (logs / "actor.log").read_text()
        # Threads the flood started exit once idle, and memory goes back to where it was.
        eventually(lambda: proc_status(learner.pid)[0] <= threads_before + 2, 30,
                 f"the learner's threads to go back to {threads_before}")
        threads_after, rss_after = proc_status(learner.pid)
        assert rss_after <= 1.1 * rss_before, (rss_before, rss_after)
        assert rate(status, 2) > 0
    finally:
        for stream in streams:
            stream.close()
        for s in sockets:
            s.close()
        for channel in channels:
            channel.close()
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def test_streams_beyond_max_actors_are_refused_with_resource_exhausted_naming_the_limit(serve, raw_actor, wire,
                                                                                        eventually):
    learner = serve(max_actors=2)
    first, second = raw_actor(learner.address), raw_actor(learner.address)
    assert first.send(wire.handshake(actor_id="one")).WhichOneof("kind") == "accepted"
    assert second.send(wire.handshake(actor_id="two")).WhichOneof("kind") == "accepted"
    with pytest.raises(grpc.RpcError) as refused:
        raw_actor(learner.address).send(wire.handshake(actor_id="three"))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "at most 2 streams" in refused.value.details() and "--max_actors" in refused.value.details()
    first.close()  # a stream that ends frees its place
    assert eventually(lambda: learner.service.connected_actors == 1, 10, "the first stream to end")
    assert raw_actor(learner.address).send(wire.handshake(actor_id="four")).WhichOneof("kind") == "accepted"
