"""A full disk: checkpoint and summary writes that fail leave the last good checkpoint
loadable, are logged and counted, are tried again, and a final checkpoint that cannot be
written makes the learner exit non-zero, saying so."""

import builtins
import errno
import io
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fleetrl.actor.actor import Actor
from fleetrl.actor.config import ActorConfig
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.learner import Learner
from fleetrl.learner.run.checkpoint import load_checkpoint


class FullDisk:
    """While `full`, opening a file for writing under `root` fails with ENOSPC, the way it
    does on a full disk (reads go on). It patches `open` and `io.open`: what torch.save and
    TensorBoard's writer go through."""

    def __init__(self, monkeypatch, root):
        self.root = os.path.abspath(root)
        self.full = False
        real_open = io.open

        def open_(file, mode="r", *args, **kwargs):
            writing = any(c in mode for c in "wax+")
            if self.full and writing and isinstance(file, (str, bytes, os.PathLike)) and \
                    os.path.abspath(os.fsdecode(file)).startswith(self.root):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(file))
            return real_open(file, mode, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", open_)
        monkeypatch.setattr(io, "open", open_)


# TensorBoard's writer thread re-raises the error it hands to the next flush; that flush is what is checked.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_training_goes_on_through_a_full_disk_and_writes_again_once_there_is_room(tmp_path, monkeypatch, eventually):
    logdir = tmp_path / "run"
    disk = FullDisk(monkeypatch, tmp_path)
    learner = Learner(LearnerConfig(problem="cartpole", bind="127.0.0.1:0", logdir=str(logdir),
                                    summary_interval_s=0.2, checkpoint_every_steps=3))
    summary = []
    run = threading.Thread(target=lambda: summary.append(learner.run()))
    run.start()
    actor = Actor(ActorConfig(learner_address=learner.address, problem="cartpole", num_envs=8, max_reconnect_s=10))
    actor_errors = []  # the filter above hides thread exceptions, so the actor's are caught here

    def act():
        try:
            actor.run()
        except BaseException as e:
            actor_errors.append(e)

    acting = threading.Thread(target=act)
    acting.start()
    checkpoints = learner.run_state.checkpoints
    try:
        eventually(lambda: checkpoints.latest() is not None, 60, "a first checkpoint")
        disk.full = True
        good, version = checkpoints.latest(), learner.policy.version
        full_since = time.monotonic()  # full for long enough that summary writes (every 0.2 s) fail too
        eventually(lambda: learner.run_state.failed_checkpoint_writes >= 3 and time.monotonic() - full_since > 1.5, 60,
                 "three failed checkpoint writes")
        # Training went on, and the last good checkpoint is still the latest, whole.
        assert learner.policy.version >= version + 6 and not learner.is_finished()
        assert checkpoints.latest() == good and load_checkpoint(good)["policy_version"] <= version
        assert not [f for f in os.listdir(checkpoints.directory) if ".tmp-" in f]  # nothing half-written left
        disk.full = False
        eventually(lambda: checkpoints.latest() != good, 60, "a checkpoint once there is room again")
        assert load_checkpoint(checkpoints.latest())["policy_version"] > version
    finally:
        disk.full = False
        learner.finish("test over")
        run.join(timeout=60)
        acting.join(timeout=60)
    assert not acting.is_alive() and actor_errors == []  # the actor played on through the full disk, then ended
    assert summary and summary[0].final_checkpoint == checkpoints.latest()
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    scalars = {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert max(scalars["learner/failed_checkpoint_writes"]) >= 3
    assert max(scalars["learner/failed_summary_writes"]) >= 1  # written once TensorBoard's file could be again
    assert len([f for f in os.listdir(logdir) if f.startswith("events.out")]) >= 2  # a new file after the failure


def test_a_final_checkpoint_that_cannot_be_written_makes_the_learner_exit_3_saying_so(tmp_path, eventually):
    logdir = tmp_path / "run"
    logdir.mkdir()
    (logdir / "checkpoints").write_text("a file where the checkpoint folder should be: every write there fails")
    learner = subprocess.Popen([sys.executable, "-m", "fleetrl.launch.learner", "--problem=cartpole",
                                f"--logdir={logdir}", "--bind=127.0.0.1:0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        eventually(lambda: (logdir / "learner_address").exists() or learner.poll() is not None, 60, "the learner")
        learner.send_signal(signal.SIGTERM)
        output, _ = learner.communicate(timeout=60)
    finally:
        learner.kill()
    assert learner.returncode == 3, output
    assert "the final checkpoint was NOT written" in output and "checkpoint at policy version 0 not written" in output
