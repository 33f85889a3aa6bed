"""Writes fleetrl's synthetic Room-to-Room dataset (see `fleetrl.envs.r2r.synthetic`):

    python -m fleetrl.launch.r2r_synthetic --out=data/r2r_synthetic

The r2r Problem generates it by itself on first use; this command makes one with other
settings (more houses, wider features, another seed) to point `--data_dir` at.
"""

from __future__ import annotations

from absl import logging

from fleetrl.envs.r2r.synthetic import SyntheticConfig, generate
from fleetrl.launch.flags import define_flags, from_flags, run_main

define_flags(SyntheticConfig)


def main(argv: list[str]) -> int:
    del argv
    config = from_flags(SyntheticConfig)
    counts = generate(config)
    logging.info("wrote %s instructions to %s", counts, config.out)
    return 0


def run() -> None:
    run_main(main, __doc__)


if __name__ == "__main__":
    run()
