"""Learner capacity: how many env steps one learner serves, fed by synthetic actor streams.

    python -m fleetrl.bench.learner_capacity --problems=cartpole --streams=1,4,16,64,256 --envs=1,4,32

For each Problem, streams x envs per stream, and training off and on, one cell:

- a learner (`launch.learner`, its own process, the Problem's defaults, `--max_actors` and
  `--inference_batch_size` sized to the cell);
- `--client_processes` client processes, which hold the streams between them, a thread
  each (`--client=sync`, as actors do), or all on one event loop (`--client=aio`, cheaper
  per message, so more of a small machine's cores go to the learner). A stream
  handshakes as an actor does, then sends pre-encoded, valid Step messages (real
  observations of the Problem's env, episodes ending every `--episode_length` steps, each
  reported with its return and length as a healthy actor would) and
  waits for each answer. Clients do no env work, so what is measured is the
  learner.

Printed per cell: env steps/s served, messages/s, the mean inference batch (and its share
of the connected envs), round-trip latency at p50 and p99, and the learner process's CPU
time per message and per env step (from /proc, over the measured window), and the clients'
CPU time per message (what an actor's gRPC costs it, without its envs). "Training off"
runs the learner with `--notrain`: unrolls are assembled and dropped.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import numpy as np
from absl import app, flags

from fleetrl.actor.extras import vector_extras
from fleetrl.problems.registry import load_problem
from fleetrl.proto import PROTOCOL_VERSION
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc
from fleetrl.proto.tensors import encode_all

FLAGS = flags.FLAGS
TICKS = os.sysconf("SC_CLK_TCK")


def define_flags() -> None:
    flags.DEFINE_list("problems", ["cartpole", "gym_cards/ezpoints", "r2r"], "Problems (one model each).")
    flags.DEFINE_list("streams", ["1", "4", "16", "64", "256"], "Actor streams.")
    flags.DEFINE_list("envs", ["1", "4", "32"], "Envs per stream.")
    flags.DEFINE_list("training", ["off", "on"], "Learner training off, on, or both.")
    flags.DEFINE_integer("max_envs", 2048, "Skip cells with more envs in all than this.")
    flags.DEFINE_integer("client_processes", 2, "Processes that hold the streams.")
    flags.DEFINE_float("warmup_s", 3.0, "Seconds before measuring.")
    flags.DEFINE_float("measure_s", 8.0, "Seconds measured per cell.")
    flags.DEFINE_integer("episode_length", 50, "Steps between an env's episode ends.")
    flags.DEFINE_list("learner_flags", [], "More flags for the learner, as name=value.")
    flags.DEFINE_list("hparams", [], "Problem hparams, as name=value, for the learner and the streams alike "
                      "(image_size=256 for LIBERO's cameras on fleetrl.bench.libero_shaped:LiberoShapedProblem).")
    flags.DEFINE_enum("client", "sync", ["sync", "aio"], "The clients' gRPC: sync (a thread per stream, as an "
                      "actor) or aio (every stream of a client process on one event loop: cheaper per message, so "
                      "more of two cores is left to the learner).")


# ----- the synthetic streams -----

def step_messages(problem_name: str, num_envs: int, episode_length: int,
                  hparams: dict[str, str] | None = None) -> tuple[pb.ActorMessage, list[bytes]]:
    """The handshake, and `episode_length` serialized Step messages for `num_envs` envs whose
    observations are the Problem env's own (a pool from random play)."""
    problem = load_problem(problem_name, hparams)
    env = problem.make_actor_env()
    names = [spec.name for spec in problem.observation_specs()]
    pool, (obs, info) = [], env.reset(seed=0)
    for _ in range(64):
        pool.append(obs if isinstance(obs, dict) else {names[0]: obs})
        try:
            obs, _, terminated, truncated, info = env.step(env.action_space.sample())
        except ValueError:  # not legal in this state (R2R's slots): action 0 always is
            obs, _, terminated, truncated, info = env.step(0)
        if terminated or truncated:
            obs, info = env.reset()
    env.close()
    extra_specs = problem.extra_specs()
    handshake = pb.ActorMessage(handshake=pb.Handshake(
        protocol_version=PROTOCOL_VERSION, problem=problem_name, actor_id="bench", num_envs=num_envs,
        observation_spec=[s.to_proto() for s in problem.observation_specs()],
        action_spec=[s.to_proto() for s in problem.action_specs()],
        extra_spec=[s.to_proto() for s in extra_specs]))
    run_ids = (np.arange(num_envs, dtype=np.uint64) + 1).tolist()
    messages = []
    for k in range(episode_length):
        picked = [pool[(k + j) % len(pool)] for j in range(num_envs)]
        observations = {name: np.stack([o[name] for o in picked]) for name in picked[0]}
        ended = [(k + j) % episode_length == episode_length - 1 for j in range(num_envs)]
        extras = vector_extras({}, extra_specs, num_envs)
        # Each ended episode reported as a healthy actor does: the step after an end is the
        # next episode's reset, so an episode is episode_length - 1 rewarded steps.
        episodes = [pb.EpisodeStats(env_index=j, metrics={"return": episode_length - 1.0,
                                                          "length": episode_length - 1.0})
                    for j in range(num_envs) if ended[j]]
        step = pb.Step(env_indices=range(num_envs), run_ids=run_ids, observations=encode_all(observations),
                       rewards=[1.0] * num_envs, terminated=ended, truncated=[False] * num_envs,
                       extras=encode_all(extras), finished_episodes=episodes)
        messages.append(pb.ActorMessage(step=step).SerializeToString())
    return handshake, messages


def run_stream(address: str, actor_id: str, handshake: pb.ActorMessage, messages: list[bytes], start_at: float,
               stop_at: float, results: list) -> None:
    """One actor stream until `stop_at`: (steps answered, round trips) after `start_at`."""
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 256 << 20),
                                                      ("grpc.max_receive_message_length", 256 << 20)])
    requests: queue.SimpleQueue = queue.SimpleQueue()
    # Pre-serialized messages skip the client's encoding: a call whose serializer passes bytes.
    call = channel.stream_stream("/fleetrl.Learner/Stream", request_serializer=lambda b: b,
                                 response_deserializer=pb.LearnerMessage.FromString)
    responses = call(iter(requests.get, None))
    hello = pb.ActorMessage()
    hello.CopyFrom(handshake)
    hello.handshake.actor_id = actor_id
    requests.put(hello.SerializeToString())
    next(responses)
    rtts, messages_sent, i = [], 0, 0
    try:
        while time.monotonic() < stop_at:
            sent = time.monotonic()
            requests.put(messages[i % len(messages)])
            answer = next(responses)
            if answer.WhichOneof("kind") != "actions":
                break
            if sent >= start_at:
                rtts.append(time.monotonic() - sent)
                messages_sent += 1
            i += 1
    finally:
        requests.put(None)
        channel.close()
    results.append((messages_sent, rtts))


async def run_aio_streams(address: str, index: int, streams: int, handshake: pb.ActorMessage, messages: list[bytes],
                          start_at: float, stop_at: float) -> list:
    """`run_stream`'s work for all of a process's streams, on one event loop and one channel."""
    channel = grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 256 << 20),
                                                          ("grpc.max_receive_message_length", 256 << 20)])
    call_stream = channel.stream_stream("/fleetrl.Learner/Stream", request_serializer=lambda b: b,
                                        response_deserializer=pb.LearnerMessage.FromString)

    async def one(i: int) -> tuple[int, list[float]]:
        call = call_stream()
        hello = pb.ActorMessage()
        hello.CopyFrom(handshake)
        hello.handshake.actor_id = f"bench-{index}-{i}"
        await call.write(hello.SerializeToString())
        await call.read()
        rtts, sent_count, k = [], 0, 0
        while time.monotonic() < stop_at:
            sent = time.monotonic()
            await call.write(messages[k % len(messages)])
            answer = await call.read()
            if answer is grpc.aio.EOF or answer.WhichOneof("kind") != "actions":
                break
            if sent >= start_at:
                rtts.append(time.monotonic() - sent)
                sent_count += 1
            k += 1
        await call.done_writing()
        return sent_count, rtts

    try:
        return await asyncio.gather(*(one(i) for i in range(streams)))
    finally:
        await channel.close()


def window_cpu(start_at: float, stop_at: float, out: list) -> None:
    """This process's CPU seconds (all its threads) between `start_at` and `stop_at`."""
    time.sleep(max(0.0, start_at - time.monotonic()))
    started = time.process_time()
    time.sleep(max(0.0, stop_at - time.monotonic()))
    out.append(time.process_time() - started)


def client(index: int, address: str, problem_name: str, streams: int, num_envs: int, episode_length: int,
           start_at: float, stop_at: float, out: multiprocessing.Queue, kind: str = "sync",
           hparams: dict[str, str] | None = None) -> None:
    """Puts (messages answered, round trips, CPU seconds) of the measured window on `out`."""
    handshake, messages = step_messages(problem_name, num_envs, episode_length, hparams)
    cpu: list[float] = []
    meter = threading.Thread(target=window_cpu, args=(start_at, stop_at, cpu))
    meter.start()
    if kind == "aio":
        results = asyncio.run(run_aio_streams(address, index, streams, handshake, messages, start_at, stop_at))
    else:
        results = []
        threads = [threading.Thread(target=run_stream, args=(address, f"bench-{index}-{i}", handshake, messages,
                                                             start_at, stop_at, results)) for i in range(streams)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    meter.join()
    out.put((sum(m for m, _ in results), [r for _, rtts in results for r in rtts], cpu[0]))


# ----- the learner -----

def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def status(address: str) -> pb.Status:
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=10)


def cell(problem: str, streams: int, num_envs: int, training: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as logdir:
        learner = subprocess.Popen(
            [sys.executable, "-m", "fleetrl.launch.learner", f"--problem={problem}", f"--logdir={logdir}",
             "--bind=127.0.0.1:0", f"--max_actors={streams + 4}", f"--inference_batch_size={streams * num_envs}",
             "--train" if training else "--notrain", "--checkpoint_interval_s=0",
             *(f"--{flag}" for flag in FLAGS.learner_flags),
             *([f"--hparams={','.join(FLAGS.hparams)}"] if FLAGS.hparams else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            address_file = os.path.join(logdir, "learner_address")
            while not os.path.exists(address_file):
                if learner.poll() is not None:
                    raise RuntimeError(f"the learner exited: {learner.stderr.read()[-2000:]}")
                time.sleep(0.1)
            with open(address_file) as f:
                address = f.read().strip()
            processes = min(FLAGS.client_processes, streams)
            now = time.monotonic() + 5.0  # the clients' set-up: building messages, handshakes
            start_at, stop_at = now + FLAGS.warmup_s, now + FLAGS.warmup_s + FLAGS.measure_s
            out: multiprocessing.Queue = multiprocessing.get_context("spawn").Queue()
            clients = [multiprocessing.get_context("spawn").Process(
                target=client, args=(i, address, problem, len(range(i, streams, processes)), num_envs,
                                     FLAGS.episode_length, start_at, stop_at, out, FLAGS.client,
                                     dict(h.split("=", 1) for h in FLAGS.hparams)))
                       for i in range(processes)]
            for c in clients:
                c.start()
            time.sleep(max(0.0, start_at - time.monotonic()))
            cpu0, steps0, t0 = cpu_seconds(learner.pid), status(address), time.monotonic()
            time.sleep(max(0.0, stop_at - time.monotonic()))
            cpu1, steps1, t1 = cpu_seconds(learner.pid), status(address), time.monotonic()
            gathered = [out.get(timeout=120) for _ in clients]
            for c in clients:
                c.join(timeout=30)
        finally:
            learner.send_signal(signal.SIGINT)
            try:
                learner.wait(timeout=60)
            except subprocess.TimeoutExpired:
                learner.kill()
    seconds = t1 - t0
    messages = sum(m for m, _, _ in gathered)
    rtts = np.array([r for _, rtt, _ in gathered for r in rtt]) * 1000
    env_steps = (steps1.env_steps - steps0.env_steps) / seconds
    cpu = cpu1 - cpu0
    return {"env_steps_per_s": env_steps, "messages_per_s": messages / seconds,
            "batch": steps1.mean_inference_batch_size, "fill": steps1.mean_inference_batch_size / (streams * num_envs),
            "p50_ms": float(np.percentile(rtts, 50)) if len(rtts) else float("nan"),
            "p99_ms": float(np.percentile(rtts, 99)) if len(rtts) else float("nan"),
            "cpu_us_per_message": 1e6 * cpu / max(messages, 1),
            "cpu_us_per_env_step": 1e6 * cpu / max(env_steps * seconds, 1),
            "client_cpu_us_per_message": 1e6 * sum(c for _, _, c in gathered) / max(messages, 1)}


def main(argv: list[str]) -> None:
    del argv
    print(f"learner capacity: {os.cpu_count()} CPUs, {FLAGS.client_processes} client processes, "
          f"{FLAGS.warmup_s:g}s warm-up, {FLAGS.measure_s:g}s measured per cell", flush=True)
    header = (f"{'problem':<20} {'train':>5} {'streams':>7} {'envs':>4} | {'env steps/s':>11} {'msgs/s':>8} "
              f"{'batch':>6} {'fill':>5} | {'p50 ms':>7} {'p99 ms':>7} | {'CPU us/msg':>10} {'CPU us/step':>11} | "
              f"{'client us/msg':>13}")
    print(header)
    print("-" * len(header), flush=True)
    for problem in FLAGS.problems:
        for training in FLAGS.training:
            for streams in (int(s) for s in FLAGS.streams):
                for num_envs in (int(e) for e in FLAGS.envs):
                    if streams * num_envs > FLAGS.max_envs:
                        continue
                    try:
                        r = cell(problem, streams, num_envs, training == "on")
                    except Exception as e:  # one cell's failure is a figure too
                        print(f"{problem:<20} {training:>5} {streams:>7} {num_envs:>4} | failed: {e}", flush=True)
                        continue
                    print(f"{problem:<20} {training:>5} {streams:>7} {num_envs:>4} | {r['env_steps_per_s']:>11,.0f} "
                          f"{r['messages_per_s']:>8,.0f} {r['batch']:>6.1f} {r['fill']:>5.0%} | "
                          f"{r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f} | {r['cpu_us_per_message']:>10,.0f} "
                          f"{r['cpu_us_per_env_step']:>11,.0f} | {r['client_cpu_us_per_message']:>13,.0f}",
                          flush=True)


if __name__ == "__main__":
    define_flags()
    app.run(main)
