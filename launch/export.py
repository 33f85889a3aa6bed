"""Exports a checkpoint's weights: `python -m fleetrl.launch.export --checkpoint=... --output=model.pt`.

The file holds the agent's state_dict under "model" plus "problem", "hparams" and
"policy_version", and loads with `torch.load(path, weights_only=True)`:

    problem = load_problem(w["problem"], w["hparams"]); agent = problem.make_agent()
    agent.load_state_dict(w["model"])
"""

from __future__ import annotations

from absl import logging

from fleetrl.launch.configs import ExportConfig
from fleetrl.launch.flags import define_flags, from_flags, run_main
from fleetrl.learner.checkpoint import export_weights

define_flags(ExportConfig)


def main(argv: list[str]) -> int:
    del argv
    try:
        config = from_flags(ExportConfig)
        exported = export_weights(config.checkpoint, config.output)
    except ValueError as e:  # no --checkpoint, or not a readable checkpoint
        logging.error("%s", e)
        return 2
    print(f"exported {exported['problem']} at policy version {exported['policy_version']:,} to {config.output}")
    return 0


def run() -> None:
    run_main(main, __doc__)


if __name__ == "__main__":
    run()
