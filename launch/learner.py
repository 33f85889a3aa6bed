"""Runs a learner: `python -m fleetrl.launch.learner --problem=cartpole --logdir=... --bind=HOST:PORT`.

It serves actors until the run ends (total_env_steps, target_mean_return, SIGTERM or
Ctrl-C), then writes a final checkpoint and `summary.json` to the logdir. Exit code: 0
(also when stopped by SIGTERM or SIGINT), 1 when a target return was set and the run
ended without reaching it, 2 for a bad configuration, 3 when the final checkpoint could
not be written (a full disk, say; the last good one is named in the log), 4 when another
learner rank died or hung past --collective_timeout_s. The bound
address is written to `<logdir>/learner_address` (useful with --bind=127.0.0.1:0).

Learner ranks: `torchrun --nproc_per_node=N -m fleetrl.launch.learner ...` (or --world_size
and --rank) starts N data-parallel ranks (docs/deployment.md); rank r serves on --bind's
port + r and writes its address to `<logdir>/learner_address.rank<r>`.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading

from absl import flags, logging

from fleetrl.common.extras import MissingExtra
from fleetrl.common.files import atomic_write_text
from fleetrl.launch.configs import LearnerLaunchConfig
from fleetrl.launch.flags import define_flags, from_flags, learner_config_from_flags, run_main
from fleetrl.launch.progress import Progress
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.learner import Learner
from fleetrl.learner.run.run_files import address_file
from fleetrl.learner.training.data_parallel import RankEnv, RankFailure
from fleetrl.learner.transport.serving import dialable_address

define_flags(LearnerConfig)
define_flags(LearnerLaunchConfig, skip=("learner",))
FLAGS = flags.FLAGS


def rank_config(config: LearnerConfig) -> LearnerConfig:
    """Under torchrun (WORLD_SIZE and RANK set) and flags that leave them unset: its rank.
    Rank r serves on --bind's port + r, so one command line serves every rank of a host;
    with --device=cuda, it trains on cuda:LOCAL_RANK."""
    if flags.FLAGS["world_size"].using_default_value and "WORLD_SIZE" in os.environ:
        env = RankEnv.from_environment()
        config = dataclasses.replace(config, rank=env.rank, world_size=env.world_size)
    if config.device == "cuda" and "LOCAL_RANK" in os.environ:  # one GPU per rank of this host, as torchrun counts
        config = dataclasses.replace(config, device=f"cuda:{int(os.environ['LOCAL_RANK'])}")
    host, _, port = config.bind.rpartition(":")
    if config.rank and port.isdigit() and int(port) != 0:
        config = dataclasses.replace(config, bind=f"{host}:{int(port) + config.rank}")
    return config


def main(argv: list[str]) -> int:
    del argv
    try:
        config = rank_config(learner_config_from_flags())
        launch = from_flags(LearnerLaunchConfig, learner=config)
        learner = Learner(config)
    except (ValueError, MissingExtra) as e:  # a bad flag or hparam, an unknown Problem, a missing extra, ...
        logging.error("%s", e)
        return 2
    os.makedirs(config.logdir, exist_ok=True)
    dialable = dialable_address(learner.address)  # a wildcard bind is no address to dial
    atomic_write_text(address_file(config.logdir, config.rank), dialable)
    ranks = f" (rank {config.rank} of {config.world_size})" if config.world_size > 1 else ""
    every = f" (every interface: actors dial {dialable})" if dialable != learner.address else ""
    logging.info("learner for %s serving on %s%s%s, logdir %s", config.problem, learner.address, every, ranks,
                 config.logdir)

    signalled = []

    def on_signal(signum, frame):
        signalled.append(signum)
        learner.finish(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    progress = ProgressThread(learner.status, launch.progress_interval_s) \
        if launch.progress_interval_s and config.rank == 0 else None
    try:
        summary = learner.run()
    except RankFailure as e:  # another learner rank died or hung: this one's checkpoint and logs are written
        logging.error("%s", e)
        exit_now(4)
    if progress is not None:
        progress.stop()
    logging.info("run ended: %s; %s env steps, %s episodes, mean return %.1f, %s trainer steps, %.0fs",
                 summary.reason, f"{summary.env_steps:,}", summary.episodes, summary.mean_episode_return,
                 summary.trainer_steps, summary.wall_s)
    if summary.final_checkpoint is None and config.rank == 0:  # rank 0 writes the checkpoints
        logging.error("the final checkpoint was NOT written (see the error above): a resume starts from %s",
                      learner.run_state.checkpoints.latest() or "scratch (no checkpoint was written)")
        code = 3
    else:
        failed = summary.reason.startswith("error:")  # the learner's own failure ended the run
        code = 1 if failed or (summary.target_reached is False and not signalled) else 0
    if config.world_size > 1:
        exit_now(code)
    return code


class ProgressThread:
    """launch.local's progress line, for a learner started by hand: the learner's own status
    every `interval_s`, on a thread of its own while the run trains."""

    def __init__(self, status, interval_s: float):
        self._status, self._interval_s = status, interval_s
        self._progress = Progress(sys.stdout.isatty())
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._show, name="progress", daemon=True)
        self._thread.start()

    def _show(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self._progress.show(self._status())

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()
        self._progress.end()


def exit_now(code: int) -> None:
    """Exits a learner rank whose files are all written, skipping the interpreter's teardown:
    there, objects that still hold torch.distributed's process groups (FSDP's meshes) are freed
    while gloo's C++ threads run, which aborts the process (SIGABRT, "terminate called without an
    active exception") about once in a dozen FSDP runs here."""
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run() -> None:
    run_main(main, __doc__, problem_flags=True)


if __name__ == "__main__":
    run()
