"""Runs a learner: `python -m fleetrl.launch.learner --problem=cartpole --logdir=... --bind=HOST:PORT`.

It serves actors until the run ends (total_env_steps, target_mean_return, SIGTERM or
Ctrl-C), then writes a final checkpoint and `summary.json` to the logdir. Exit code: 0
(also when stopped by SIGTERM or SIGINT), 1 when a target return was set and the run
ended without reaching it, 2 for a bad configuration, 3 when the final checkpoint could
not be written (a full disk, say; the last good one is named in the log). The bound
address is written to `<logdir>/learner_address` (useful with --bind=127.0.0.1:0).
"""

from __future__ import annotations

import os
import signal

from absl import flags, logging

from fleetrl.common.extras import MissingExtra
from fleetrl.common.files import atomic_write_text
from fleetrl.launch.flags import define_flags, learner_config_from_flags, run_main
from fleetrl.learner.config import LearnerConfig
from fleetrl.learner.learner import Learner

define_flags(LearnerConfig)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> int:
    del argv
    try:
        config = learner_config_from_flags()
        learner = Learner(config)
    except (ValueError, MissingExtra) as e:  # a bad flag or hparam, an unknown Problem, a missing extra, ...
        logging.error("%s", e)
        return 2
    if not config.bind.startswith(("127.", "localhost", "unix:", "[::1]")) and not learner.authenticated:
        logging.warning("serving %s to other hosts without authentication: anyone who can reach this "
                        "address can join the run (set --auth_token_file or --tls_client_ca)", config.bind)
    os.makedirs(config.logdir, exist_ok=True)
    atomic_write_text(os.path.join(config.logdir, "learner_address"), learner.address)
    logging.info("learner for %s serving on %s, logdir %s", config.problem, learner.address, config.logdir)

    signalled = []

    def on_signal(signum, frame):
        signalled.append(signum)
        learner.finish(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    summary = learner.run()
    logging.info("run ended: %s; %s env steps, %s episodes, mean return %.1f, %s trainer steps, %.0fs",
                 summary.reason, f"{summary.env_steps:,}", summary.episodes, summary.mean_episode_return,
                 summary.trainer_steps, summary.wall_s)
    if summary.final_checkpoint is None:
        logging.error("the final checkpoint was NOT written (see the error above): a resume starts from %s",
                      learner.run_state.checkpoints.latest() or "scratch (no checkpoint was written)")
        return 3
    return 1 if summary.target_reached is False and not signalled else 0


def run() -> None:
    run_main(main, __doc__, problem_flags=True)


if __name__ == "__main__":
    run()
