"""A soak run: CartPole for --minutes with kills and a hostile client, and a row of figures
every minute. Not in CI.

    python -m fleetrl.bench.soak --minutes=30

What runs: a learner (`launch.learner`), --num_actors train actors (real `Actor`s, each in
its own process: bench/soak_fleet.py), one eval actor (`launch.actor --mode=eval`), and a
client that sends malformed messages at --hostile_rate a second (bench/hostile_client.py).

What happens to them: a random train actor is SIGKILLed every --actor_kill_s (a random
time in that range) and a new one takes its place; the learner is SIGKILLed every
--learner_kill_s (half a row later, so that no row falls on a restart) and started again
on the same port and logdir, as Ray would restart it, and resumes from its latest
checkpoint (written every --checkpoint_interval_s).

Each minute the actors are paused for a moment at a point where none has a step in
flight, and one row is printed and appended to <logdir>/soak.jsonl: env steps/s, the
mean return, the learner's RSS and threads, checkpoints written and whether the latest
loads, episodes counted by the learner against episodes the learner answered to the
actors (double and lost counts; see soak_checks.py for the accounting), steps resent,
malformed messages rejected, and TensorBoard's step axis (regressions, largest gap).

At the end the learner is stopped with SIGTERM, and the pass criteria are checked:
learner RSS growth under --max_rss_growth after --rss_warmup_s (within each learner
process), no unloadable latest checkpoint, no double-counted episode, no TensorBoard step
regression, and a mean return of --target reached. Exit code 0 when all hold, else 1.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import sys
import tempfile
import time

import grpc
import numpy as np
from absl import app, flags

from fleetrl.bench.hostile_client import HostileClient
from fleetrl.bench.soak_checks import (
    ActorCounts,
    CheckpointRead,
    process_use,
    read_checkpoint,
    scan_steps,
    taken_in,
    window_episodes,
)
from fleetrl.bench.soak_fleet import TrainActors
from fleetrl.bench.soak_probe import ResendProbe
from fleetrl.launch.processes import Child, ChildProcesses
from fleetrl.learner.run.checkpoint import CheckpointDir
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc

FLAGS = flags.FLAGS
STEP_TAG = "throughput/env_steps_per_s"  # written at every summary: TensorBoard's step axis


def define_flags() -> None:
    flags.DEFINE_float("minutes", 30, "Length of the run.")
    flags.DEFINE_integer("num_actors", 4, "Train actors.")
    flags.DEFINE_integer("envs_per_actor", 16, "Envs per train actor.")
    flags.DEFINE_list("actor_kill_s", ["20", "40"], "A train actor is SIGKILLed every uniform(low, high) seconds.")
    flags.DEFINE_float("learner_kill_s", 300, "The learner is SIGKILLed and restarted this often (0: never).")
    flags.DEFINE_float("checkpoint_interval_s", 30, "The learner's --checkpoint_interval_s.")
    flags.DEFINE_float("hostile_rate", 5, "Malformed messages a second.")
    flags.DEFINE_float("report_s", 60, "Seconds between rows.")
    flags.DEFINE_float("rss_warmup_s", 60, "RSS growth is measured from this long after each learner start.")
    flags.DEFINE_float("max_rss_growth", 0.10, "Pass criterion: RSS growth after warm-up, per learner process.")
    flags.DEFINE_float("target", 475, "Pass criterion: the mean return of the last 100 episodes reaches this.")
    flags.DEFINE_integer("seed", 0, "Seeds the learner, the actors and the kill schedule.")
    flags.DEFINE_string("logdir", None, "The run's logdir (default: a new temporary folder, kept).")


@dataclasses.dataclass
class Snapshot:
    """What the learner and the actors said at one paused moment (or at a learner's restart)."""

    time: float
    episodes: int
    env_steps: int
    counts: dict[str, ActorCounts]
    after_restart: bool = False


@dataclasses.dataclass
class Totals:
    counted: int = 0
    answered: int = 0
    double: int = 0
    lost: int = 0
    unmeasured_windows: int = 0
    probe_resends: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (expected, counted)
    probe_new: list[int] = dataclasses.field(default_factory=list)  # counted, of one each
    probe_errors: list[str] = dataclasses.field(default_factory=list)
    resent_steps: int = 0  # of learner processes that are gone
    unloadable: list[str] = dataclasses.field(default_factory=list)
    checkpoints: set[str] = dataclasses.field(default_factory=set)
    best_return: float = -math.inf
    rss_growth: list[float] = dataclasses.field(default_factory=list)  # per learner process


class LearnerProcess:
    """The learner process: started, SIGKILLed and started again on the same port."""

    def __init__(self, children: ChildProcesses, logdir: str, seed: int):
        self._children, self.logdir = children, logdir
        self._flags = ["--problem=cartpole", f"--logdir={logdir}", f"--seed={seed}", "--summary_interval_s=5",
                       f"--checkpoint_interval_s={FLAGS.checkpoint_interval_s}"]
        self.restarts = 0
        self.child: Child | None = None
        self.address = self._start("127.0.0.1:0")
        self.rss: list[tuple[float, float]] = []  # (seconds since start, MB) of this process

    def _start(self, bind: str) -> str:
        address_file = os.path.join(self.logdir, "learner_address")
        if os.path.exists(address_file):
            os.remove(address_file)
        self.child = self._children.start("learner", [sys.executable, "-m", "fleetrl.launch.learner",
                                                      f"--bind={bind}", *self._flags],
                                          os.path.join(self.logdir, "logs", "learner.log"))
        self.started_at = time.monotonic()
        self.rss = []
        while not os.path.exists(address_file):
            if self.child.process.poll() is not None:
                raise RuntimeError(f"the learner exited with code {self.child.process.returncode}:\n"
                                   f"{self.child.tail()}")
            time.sleep(0.1)
        with open(address_file) as f:
            return f.read().strip()

    def restart(self) -> None:
        self.restarts += 1
        self._start(self.address)

    def status(self) -> pb.Status | None:
        with grpc.insecure_channel(self.address) as channel:
            try:
                return pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=5)
            except grpc.RpcError:
                return None

    def episodes(self) -> int:
        status = self.status()
        if status is None:
            raise RuntimeError(f"the learner at {self.address} did not answer GetStatus")
        return taken_in(status)

    def sample_rss(self) -> tuple[float, int] | None:
        use = process_use(self.child.process.pid)
        if use is not None:
            self.rss.append((time.monotonic() - self.started_at, use.rss_mb))
            return use.rss_mb, use.threads
        return None

    def rss_growth(self) -> float | None:
        """Growth of RSS after warm-up in this process: its largest over its first (None: too short to say)."""
        after = [mb for t, mb in self.rss if t >= FLAGS.rss_warmup_s]
        return max(after) / after[0] - 1 if len(after) >= 2 else None


class Soak:
    def __init__(self, logdir: str):
        self.logdir = logdir
        self.children = ChildProcesses()
        self.learner = LearnerProcess(self.children, logdir, FLAGS.seed)
        self.hostile = HostileClient(self.learner.address, FLAGS.hostile_rate, seed=FLAGS.seed)
        self.probe = ResendProbe(self.learner.address)
        self.probe_restarts_seen = 0
        self.probe_counted_at = 0  # the learner's count right after the probe's last new step
        self.resumed_episodes = 0  # the count in the checkpoint the last restart resumed from
        self.checkpoint_dir = CheckpointDir(os.path.join(logdir, "checkpoints"), keep=1 << 30)
        self.totals = Totals()
        self.status: pb.Status | None = None  # the learner's at the last snapshot
        self.rows: list[dict] = []
        # Before any actor: the learner's count, and no actor counters yet.
        status = self.learner.status()
        self.baseline: Snapshot | None = Snapshot(time.monotonic(), taken_in(status), status.env_steps, {})
        self.actors = TrainActors(self.learner.address, FLAGS.num_actors, FLAGS.envs_per_actor,
                                  os.path.join(logdir, "logs"), FLAGS.seed, max_reconnect_s=300)
        self.children.start("eval-actor", [sys.executable, "-m", "fleetrl.launch.actor", "--mode=eval",
                                           f"--learner_address={self.learner.address}", "--num_envs=4",
                                           "--max_reconnect_s=300"], os.path.join(logdir, "logs", "eval-actor.log"))

    def run(self) -> int:
        rng = np.random.default_rng(FLAGS.seed)
        low, high = (float(x) for x in FLAGS.actor_kill_s)
        start = time.monotonic()
        end = start + 60 * FLAGS.minutes
        next_actor_kill = start + rng.uniform(low, high)
        # Half a row after each period: the row after a restart then measures a window of
        # traffic to the new learner, not just its first answers.
        next_learner_kill = start + FLAGS.learner_kill_s + FLAGS.report_s / 2 if FLAGS.learner_kill_s else math.inf
        next_report = start + FLAGS.report_s
        self.hostile.start()
        self._print_header()
        while (now := time.monotonic()) < end:
            self.totals.checkpoints.update(self.checkpoint_dir.periodic())
            if len(self.learner.rss) == 0 or now - self.learner.started_at - self.learner.rss[-1][0] >= 5:
                self.learner.sample_rss()
            if now >= next_learner_kill:
                self._kill_learner()
                next_learner_kill += FLAGS.learner_kill_s
            if now >= next_actor_kill:
                self.actors.kill_one()
                next_actor_kill = now + rng.uniform(low, high)
            if now >= next_report:
                self._report(minute=round((now - start) / 60, 1))
                next_report += FLAGS.report_s
            time.sleep(0.2)
        self._report(minute=round((time.monotonic() - start) / 60, 1))
        return self._finish()

    def _kill_learner(self) -> None:
        growth = self.learner.rss_growth()
        if growth is not None:
            self.totals.rss_growth.append(growth)
        status = self.learner.status()
        self.totals.resent_steps += status.resent_steps if status else 0
        self.learner.child.process.send_signal(signal.SIGKILL)
        self.learner.child.process.wait()
        time.sleep(1)  # answers the learner sent before it died may still be read
        # What the new process resumes from: it must load, and its count is where the new one starts.
        latest = self.checkpoint_dir.latest()
        resumed = read_checkpoint(latest) if latest else CheckpointRead("", True)
        self._check_loadable(resumed)
        counts = self.actors.counts()  # frozen: no learner answers them until the restart
        self.resumed_episodes = resumed.episodes
        self.totals.unmeasured_windows += 1  # the last one of the killed learner: its count died with it
        self.learner.restart()
        self.baseline = Snapshot(time.monotonic(), resumed.episodes, resumed.env_steps, counts, after_restart=True)

    def _check_loadable(self, read: CheckpointRead) -> None:
        if not read.loadable:
            self.totals.unloadable.append(f"{read.path}: {read.error}")

    def _paused_reading(self) -> tuple[Snapshot, Snapshot | None] | None:
        """With the actors paused: the learner's count and the actors' counters (the end of
        one window), the probe's steps, and the count again (the start of the next)."""
        try:
            if not self.actors.pause(timeout_s=30):  # actors back off up to 10 s after a restart
                return None
            status = self.learner.status()
            if status is None:
                return None
            end = Snapshot(time.monotonic(), taken_in(status), status.env_steps, self.actors.counts())
            after_probe = self._probe(status)
        finally:
            self.actors.resume()
        if math.isfinite(status.mean_episode_return) and status.return_window and \
                status.episodes >= status.return_window:
            self.totals.best_return = max(self.totals.best_return, status.mean_episode_return)
        self.status = status
        return end, None if after_probe is None else dataclasses.replace(end, episodes=after_probe)

    def _probe(self, status: pb.Status) -> int | None:
        """The probe's resend after a restart (if one came since its last step), then its new
        step; returns the learner's count after them (None when that is not known)."""
        count = taken_in(status)
        try:
            if self.probe.held is not None and self.learner.restarts > self.probe_restarts_seen:
                self.probe_restarts_seen = self.learner.restarts
                # A checkpoint that counted the held step has a count at least the one right after it.
                expected = 0 if self.resumed_episodes >= self.probe_counted_at else 1
                self.probe.resend()
                now = self.learner.episodes()
                self.totals.probe_resends.append((expected, now - count))
                count = now
            mean = status.mean_episode_return
            self.probe.send_new(mean if math.isfinite(mean) else 20.0)
            now = self.learner.episodes()
            self.totals.probe_new.append(now - count)  # must be 1: the check can see a count
        except (grpc.RpcError, RuntimeError) as e:  # the next window then goes unmeasured
            self.totals.probe_errors.append(repr(e))
            return None
        self.probe_counted_at = now
        return now

    def _report(self, minute: float) -> None:
        reading = self._paused_reading()
        snapshot, next_baseline = reading if reading is not None else (None, None)
        row = {"minute": minute, "actor_kills": self.actors.kills, "learner_kills": self.learner.restarts}
        if snapshot is not None and self.baseline is not None:
            window = window_episodes(snapshot.episodes - self.baseline.episodes, self.baseline.counts,
                                     snapshot.counts, self.baseline.after_restart)
            for name in ("counted", "answered", "double", "lost"):
                setattr(self.totals, name, getattr(self.totals, name) + getattr(window, name))
            row["env_steps_per_s"] = round((snapshot.env_steps - self.baseline.env_steps)
                                           / (snapshot.time - self.baseline.time))
        else:
            self.totals.unmeasured_windows += 1
            row["env_steps_per_s"] = None
        self.baseline = next_baseline
        use = self.learner.sample_rss()
        latest = self.checkpoint_dir.latest()
        read = read_checkpoint(latest) if latest else None
        if read is not None:
            self._check_loadable(read)
        axis = scan_steps(self.logdir, STEP_TAG)
        hostile = self.hostile.tally()
        row.update({
            "mean_return": round(self.status.mean_episode_return, 1) if snapshot is not None else None,
            "learner_rss_mb": round(use[0]) if use else None, "learner_threads": use[1] if use else None,
            "checkpoints_written": len(self.totals.checkpoints),
            "latest_checkpoint_loads": None if read is None else read.loadable,
            "episodes_learner": self.totals.counted, "episodes_actors": self.totals.answered,
            "double_counted": self.totals.double, "lost": self.totals.lost,
            "resent_steps": self.totals.resent_steps + (self.status.resent_steps if snapshot is not None else 0),
            "probe_resends": [list(check) for check in self.totals.probe_resends],
            "rejected_messages": hostile.get("rejected", 0),
            "hostile_other": {k: v for k, v in hostile.items() if k != "rejected"},
            "tb_step_regressions": axis.regressions, "tb_max_step_gap": axis.max_gap,
        })
        self.rows.append(row)
        with open(os.path.join(self.logdir, "soak.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        self._print_row(row)

    def _print_header(self) -> None:
        print(f"soak: cartpole, {FLAGS.num_actors} actors x {FLAGS.envs_per_actor} envs + 1 eval actor, "
              f"{FLAGS.minutes:g} min; actor SIGKILL every {'-'.join(FLAGS.actor_kill_s)} s, learner SIGKILL "
              f"every {FLAGS.learner_kill_s:g} s, {FLAGS.hostile_rate:g} malformed msgs/s; logdir {self.logdir}",
              flush=True)
        print(f"{'min':>5} {'steps/s':>7} {'return':>6} {'RSS MB':>6} {'thr':>4} {'ckpts':>5} {'loads':>5} "
              f"{'ep learner':>10} {'ep actors':>10} {'double':>6} {'lost':>4} {'resent':>6} {'rejected':>8} "
              f"{'TB regr':>7} {'TB gap':>7} {'kills a/l':>9}", flush=True)

    @staticmethod
    def _print_row(row: dict) -> None:
        def show(value, spec: str = "") -> str:
            return "-" if value is None else format(value, spec)
        loads = {None: "-", True: "yes", False: "NO"}[row["latest_checkpoint_loads"]]
        print(f"{row['minute']:5.1f} {show(row['env_steps_per_s']):>7} {show(row['mean_return']):>6} "
              f"{show(row['learner_rss_mb']):>6} {show(row['learner_threads']):>4} {row['checkpoints_written']:>5} "
              f"{loads:>5} {row['episodes_learner']:>10,} {row['episodes_actors']:>10,} {row['double_counted']:>6} "
              f"{row['lost']:>4} {row['resent_steps']:>6} {row['rejected_messages']:>8} "
              f"{row['tb_step_regressions']:>7} {row['tb_max_step_gap']:>7,} "
              f"{row['actor_kills']:>4}/{row['learner_kills']}", flush=True)

    def _finish(self) -> int:
        self.hostile.stop()
        growth = self.learner.rss_growth()
        if growth is not None:
            self.totals.rss_growth.append(growth)
        self.learner.child.process.send_signal(signal.SIGTERM)
        try:
            learner_code = self.learner.child.process.wait(timeout=120)
        except Exception:  # noqa: BLE001 - reported as a failure below
            learner_code = None
        actor_codes = self.actors.stop()
        self.children.stop()
        totals = self.totals
        last = self.rows[-1]
        criteria = {
            f"learner RSS growth after warm-up < {FLAGS.max_rss_growth:.0%} (per process: "
            f"{', '.join(f'{g:+.1%}' for g in totals.rss_growth)})":
                bool(totals.rss_growth) and max(totals.rss_growth) < FLAGS.max_rss_growth,
            f"0 unloadable latest checkpoints ({len(totals.unloadable)})": not totals.unloadable,
            f"0 double-counted episodes ({totals.double})": totals.double == 0,
            f"a step resent to a restarted learner counts only if its checkpoint had not counted it "
            f"(expected, counted: {totals.probe_resends}), and each new probe step counts once "
            f"({totals.probe_new.count(1)} of {len(totals.probe_new)})":
                bool(totals.probe_resends) and all(e == c for e, c in totals.probe_resends)
                and all(c == 1 for c in totals.probe_new) and not totals.probe_errors,
            f"0 TensorBoard step regressions ({last['tb_step_regressions']})": last["tb_step_regressions"] == 0,
            f"mean return reaches {FLAGS.target:g} (best {totals.best_return:.1f})": totals.best_return >= FLAGS.target,
        }
        print(f"\n{self.actors.kills} actor kills, {self.learner.restarts} learner kills; "
              f"{len(totals.checkpoints)} checkpoints written; episodes: learner {totals.counted:,}, "
              f"actors {totals.answered:,}, lost {totals.lost} ({totals.unmeasured_windows} windows not measured: "
              f"the last of each killed learner, whose count died with it, or a failed pause); "
              f"the learner exited {learner_code}, "
              f"the train actors alive at the end {actor_codes}")
        for problem in totals.unloadable:
            print(f"unloadable: {problem}")
        for error in totals.probe_errors:
            print(f"probe error: {error}")
        for text, passed in criteria.items():
            print(f"{'pass' if passed else 'FAIL'}: {text}")
        with open(os.path.join(self.logdir, "soak.json"), "w") as f:
            json.dump({"flags": {name: FLAGS[name].value for name in (
                "minutes", "num_actors", "envs_per_actor", "actor_kill_s", "learner_kill_s",
                "checkpoint_interval_s", "hostile_rate", "seed")},
                "criteria": criteria, "learner_exit_code": learner_code, "rows": self.rows}, f, indent=1)
        return 0 if all(criteria.values()) and learner_code == 0 else 1


def main(argv: list[str]) -> int:
    del argv
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    logdir = FLAGS.logdir or tempfile.mkdtemp(prefix="fleetrl-soak-")
    os.makedirs(os.path.join(logdir, "logs"), exist_ok=True)
    soak = Soak(logdir)
    try:
        return soak.run()
    finally:
        soak.actors.stop(timeout_s=0)
        soak.children.stop()


if __name__ == "__main__":
    define_flags()
    app.run(main)
