"""What the soak run (bench/soak.py) checks, as functions of what it read: the episode
count of a window, TensorBoard's step axis, a checkpoint, and a process's memory.

Episode accounting. The soak's actors keep two counters in shared memory, so they survive
a SIGKILL: `answered`, the finished episodes in steps the learner answered, and
`finished`, those in every step the actor made. Their difference is the episodes of steps
in flight. At each snapshot every actor waits right after an answer, with nothing in
flight (see soak_fleet.py). Between two snapshots of one learner process the learner
must count exactly the episodes it answered, give or take the last step of an actor that
died in between (taken in or not). A window that starts at a learner restart also gets
the steps the actors resend to the new process: answered there, and counted unless the
checkpoint it resumed from had counted them already. Anything above the answered
episodes plus what may have been taken in unanswered is a double count.

The learner's count here is what it took in (`taken_in`): the episodes it counted and
those it could not vouch for. After a restart each env's first episode began before the new
learner saw it, so the new learner takes its report in without counting it
(`learner.episode_accounts`); the check is of the stream, once each, either way.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import NamedTuple

from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from fleetrl.learner.run.checkpoint import CheckpointError, load_checkpoint


@dataclasses.dataclass(frozen=True)
class ActorCounts:
    answered: int  # finished episodes in steps the learner answered
    finished: int  # finished episodes in steps made, answered or not
    alive: bool

    @property
    def in_flight(self) -> int:
        return self.finished - self.answered


class WindowEpisodes(NamedTuple):
    counted: int  # by the learner: its episode count's growth
    answered: int  # by the actors: episodes in the steps the learner answered them
    double: int  # counted beyond what the actors could have sent once
    lost: int  # answered but not counted, beyond what a resumed checkpoint explains


_NONE = ActorCounts(0, 0, True)


def taken_in(status) -> int:
    """The episode reports a learner took in, from its `Status`: counted or unvouched."""
    return status.episodes + status.unvouched_episodes


def window_episodes(counted: int, start: dict[str, ActorCounts], end: dict[str, ActorCounts],
                    after_restart: bool) -> WindowEpisodes:
    """Checks one window: `counted` by the learner between snapshots `start` and `end` of
    every actor's counters (an actor missing from `start` began in the window).
    `after_restart`: the window starts at a learner restart, `start` read at the kill."""
    answered = sum(e.answered - start.get(name, _NONE).answered for name, e in end.items())
    # An actor that died in the window: its last step may have been taken in, unanswered.
    died = sum(e.in_flight for name, e in end.items() if not e.alive and start.get(name, _NONE).alive)
    # Steps in flight at the kill go again to the new learner, which counts them unless its
    # checkpoint had.
    resent = sum(s.in_flight for s in start.values() if s.alive) if after_restart else 0
    excess = counted - answered
    return WindowEpisodes(counted, answered, double=max(0, excess - died), lost=max(0, -excess - resent))


class StepAxis(NamedTuple):
    points: int  # points of `tag` that TensorBoard shows
    regressions: int  # points at a lower step than the one before them, with no restart marker between
    max_gap: int  # the largest step between two consecutive shown points


def scan_steps(logdir: str, tag: str) -> StepAxis:
    """Reads the event files in `logdir` (not its subfolders) in the order they were
    written, as TensorBoard does: a restart marker (a writer's purge_step) drops the points
    at or after its step; any other step that goes back is a regression."""
    steps: list[int] = []
    regressions = 0
    for path in _event_files(logdir):
        for event in EventFileLoader(path).Load():
            if event.HasField("session_log") and event.session_log.status == event.session_log.START:
                steps = [s for s in steps if s < event.step]
                continue
            if any(value.tag == tag for value in event.summary.value):
                if steps and event.step < steps[-1]:
                    regressions += 1
                    steps = [s for s in steps if s < event.step]
                steps.append(event.step)
    max_gap = max((b - a for a, b in zip(steps, steps[1:])), default=0)
    return StepAxis(len(steps), regressions, max_gap)


def _event_files(logdir: str) -> list[str]:
    def written(name: str) -> tuple[float, float]:  # events.out.tfevents.<time>.<host>.<pid>.<n>
        match = re.match(r"events\.out\.tfevents\.(\d+(?:\.\d+)?)", name)
        return float(match.group(1)) if match else 0.0, os.path.getmtime(os.path.join(logdir, name))
    names = [n for n in os.listdir(logdir) if n.startswith("events.out.tfevents.")]
    return [os.path.join(logdir, n) for n in sorted(names, key=written)]


@dataclasses.dataclass(frozen=True)
class CheckpointRead:
    path: str
    loadable: bool
    episodes: int = 0
    env_steps: int = 0
    policy_version: int = 0
    error: str = ""


def read_checkpoint(path: str) -> CheckpointRead:
    """Loads a checkpoint as a resume would (weights only, format checked)."""
    try:
        checkpoint = load_checkpoint(path)
    except CheckpointError as e:
        return CheckpointRead(path, False, error=str(e))
    return CheckpointRead(path, True, checkpoint["episodes"], checkpoint["env_steps"], checkpoint["policy_version"])


@dataclasses.dataclass(frozen=True)
class ProcessUse:
    rss_mb: float
    threads: int


def process_use(pid: int) -> ProcessUse | None:
    """Resident memory and thread count from /proc (None once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return None
    return ProcessUse(int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"]))
