"""The transport's floor: what gRPC alone costs per message, with the learner's streaming shape.

    python -m fleetrl.bench.grpc_floor --streams=2,64

An echo server answers each message of a bidirectional stream with a small reply, in
its own process, as the learner does but with no decoding, batching or inference. It
runs two ways: the synchronous server the learner uses (a worker thread per stream) and
`grpc.aio` (every stream on one event loop). Clients are the learner-capacity benchmark's
shape: two processes holding the streams, a thread each, each stream sending a message of
a CartPole step's size and waiting for the answer.

Per cell it prints messages/s and the server process's CPU µs per message. Set against
`bench/learner_capacity.py`'s one-env cells, the difference is what the learner itself
adds per message; the floor is what no change to the learner's own code can go below.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures

import grpc
from absl import app, flags

from fleetrl.bench.learner_capacity import cpu_seconds

FLAGS = flags.FLAGS
METHOD = "/floor.Echo/Stream"
REQUEST = bytes(160)  # about a serialized CartPole Step of one env
REPLY = bytes(24)  # about its Actions


def define_flags() -> None:
    flags.DEFINE_list("streams", ["2", "64"], "Streams per cell.")
    flags.DEFINE_list("servers", ["sync", "aio"], "Server kinds compared.")
    flags.DEFINE_float("warmup_s", 2.0, "Seconds before measuring.")
    flags.DEFINE_float("measure_s", 6.0, "Seconds measured per cell.")
    flags.DEFINE_string("serve", "", "Internal: run an echo server of this kind, writing its port to --port_file.")
    flags.DEFINE_string("port_file", "", "Internal: see --serve.")
    flags.DEFINE_integer("max_streams", 300, "Internal: the sync server's worker threads.")


def _echo(requests, context):
    for _ in requests:
        yield REPLY


async def _aio_echo(requests, context):
    async for _ in requests:
        yield REPLY


def serve_sync(port_file: str) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(FLAGS.max_streams), maximum_concurrent_rpcs=FLAGS.max_streams)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "floor.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(_echo)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    _write(port_file, port)
    server.wait_for_termination()


def serve_aio(port_file: str) -> None:
    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "floor.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(_aio_echo)})])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        _write(port_file, port)
        await server.wait_for_termination()

    asyncio.run(main())


def _write(path: str, port: int) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(str(port))
    os.replace(path + ".tmp", path)


def client(address: str, streams: int, start_at: float, stop_at: float, out: multiprocessing.Queue) -> None:
    counts: list[int] = []

    def stream() -> None:
        with grpc.insecure_channel(address) as channel:
            call = channel.stream_stream(METHOD)
            requests: list = []
            ready = threading.Event()

            def outgoing():
                while True:
                    ready.wait()
                    ready.clear()
                    if not requests:
                        return
                    yield requests.pop()

            responses = call(outgoing())
            sent = 0
            while time.monotonic() < stop_at:
                requests.append(REQUEST)
                ready.set()
                next(responses)
                if time.monotonic() >= start_at:
                    sent += 1
            ready.set()  # with nothing queued: ends the stream
            responses.cancel()
            counts.append(sent)

    threads = [threading.Thread(target=stream) for _ in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put(sum(counts))


def cell(kind: str, streams: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as directory:
        port_file = os.path.join(directory, "port")
        server = subprocess.Popen([sys.executable, "-m", "fleetrl.bench.grpc_floor", f"--serve={kind}",
                                   f"--port_file={port_file}"])
        try:
            while not os.path.exists(port_file):
                time.sleep(0.05)
            with open(port_file) as f:
                address = f"127.0.0.1:{f.read()}"
            context = multiprocessing.get_context("spawn")
            out = context.Queue()
            start_at = time.monotonic() + 3.0 + FLAGS.warmup_s
            stop_at = start_at + FLAGS.measure_s
            clients = [context.Process(target=client, args=(address, len(range(i, streams, 2)), start_at, stop_at, out))
                       for i in range(min(2, streams))]
            for process in clients:
                process.start()
            time.sleep(max(0.0, start_at - time.monotonic()))
            cpu0 = cpu_seconds(server.pid)
            time.sleep(max(0.0, stop_at - time.monotonic()))
            cpu1 = cpu_seconds(server.pid)
            messages = sum(out.get(timeout=60) for _ in clients)
            for process in clients:
                process.join()
        finally:
            server.kill()
            server.wait()
    return messages / FLAGS.measure_s, 1e6 * (cpu1 - cpu0) / max(messages, 1)


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.serve:
        {"sync": serve_sync, "aio": serve_aio}[FLAGS.serve](FLAGS.port_file)
        return
    print(f"gRPC floor: echo server, {os.cpu_count()} CPUs, 2 client processes, {FLAGS.measure_s:g}s measured",
          flush=True)
    print(f"{'server':>6} {'streams':>7} {'msgs/s':>9} {'server CPU µs/msg':>18}", flush=True)
    for streams in (int(s) for s in FLAGS.streams):
        for kind in FLAGS.servers:
            rate, cpu = cell(kind, streams)
            print(f"{kind:>6} {streams:>7} {rate:9,.0f} {cpu:18,.0f}", flush=True)


if __name__ == "__main__":
    define_flags()
    app.run(main)
