"""A whole run in this process, on one thread: `python -m fleetrl.launch.debug --problem=cartpole`.

It takes launch.local's flags and runs the learner's parts and the actors' envs in the
caller's process with no gRPC and no threads (`debug_run.DebugRun`), so `breakpoint()` in
an env's `step`, a Problem's hook, an agent's `neck` or a loss stops the run there, in this
terminal, and with the same --seed two runs give the same weights, counters and summaries.
--post_mortem opens pdb where an uncaught exception was raised. The logdir holds what a
served run writes (TensorBoard, checkpoints, summary.json; --record_unrolls=N adds the first
N batches for `python -m fleetrl.launch.inspect`). Exit code: 0; 1 when a target return was
set and not reached, or the run failed; 2 for a bad configuration. docs/debugging.md.
"""

from __future__ import annotations

import bdb
import pdb
import sys
import traceback

from absl import flags

from fleetrl.common.extras import MissingExtra
from fleetrl.launch.configs import DebugConfig, FleetConfig
from fleetrl.launch.debug_run import DebugRun
from fleetrl.launch.flags import define_flags, launcher_main, run_main
from fleetrl.launch.progress import print_summary
from fleetrl.learner.config import LearnerConfig

define_flags(LearnerConfig, skip=("bind",))
define_flags(FleetConfig)
define_flags(DebugConfig, skip=("learner", "fleet"))
FLAGS = flags.FLAGS


def debug(config: DebugConfig) -> int:
    try:
        run = DebugRun(config)
    except (ValueError, MissingExtra) as e:
        print(f"fleetrl: {e}", file=sys.stderr)
        return 2
    print(f"fleetrl debug: {config.learner.problem} in this process, {config.fleet.num_actors} actors x "
          f"{config.fleet.envs_per_actor} envs, one thread; logdir {config.learner.logdir}", flush=True)
    try:
        summary = run.run_to_end()
    except bdb.BdbQuit:  # `q` at a breakpoint: the run's files are written, as at any end
        print("fleetrl debug: quit from pdb", file=sys.stderr)
        return 1
    except Exception:
        if not config.post_mortem:
            raise
        traceback.print_exc()
        print("fleetrl debug: post mortem (pdb): the frame that raised; `up` and `down` walk the stack, `q` ends",
              flush=True)
        pdb.post_mortem(sys.exc_info()[2])
        return 1
    print_summary(vars(summary))
    return 1 if summary.target_reached is False else 0


def main(argv: list[str]) -> int:
    del argv
    return launcher_main(DebugConfig, "127.0.0.1:0", debug)


def run() -> None:
    run_main(main, __doc__, problem_flags=True)


if __name__ == "__main__":
    run()
