"""Runs an actor: `python -m fleetrl.launch.actor --learner_address=HOST:PORT --num_envs=32`.

Without --problem the actor asks the learner which Problem it serves. Exit code 0 when the
learner ends the run, 1 when the learner refuses the actor or stays unreachable for
--max_reconnect_s, 2 for a bad flag.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

from fleetrl.actor.actor import Actor, ActorError
from fleetrl.actor.config import ActorConfig
from fleetrl.launch.flags import define_flags, from_flags

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
    except ActorError as e:
        logging.error("%s", e)
        return 1
    return 0


def run() -> None:
    app.run(lambda argv: sys.exit(main(argv)))


if __name__ == "__main__":
    run()
