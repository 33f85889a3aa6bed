"""Runs an actor: `python -m fleetrl.launch.actor --learner_address=HOST:PORT --num_envs=32`.

Without --problem the actor asks the learner which Problem it serves. Exit code 0 when the
learner ends the run, 1 when the learner refuses the actor or stays unreachable for
--max_reconnect_s, 2 for a bad flag.
"""

from __future__ import annotations

from absl import flags, logging

from fleetrl.actor.actor import Actor, ActorError
from fleetrl.actor.config import ActorConfig
from fleetrl.common.extras import MissingExtra
from fleetrl.launch.flags import define_flags, from_flags, run_main

define_flags(ActorConfig)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> int:
    del argv
    try:
        config = from_flags(ActorConfig)
    except ValueError as e:
        logging.error("%s", e)
        return 2
    try:
        Actor(config).run()
    except (ActorError, MissingExtra) as e:
        logging.error("%s", e)
        return 1
    return 0


def run() -> None:
    run_main(main, __doc__)


if __name__ == "__main__":
    run()
