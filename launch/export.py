"""Exports a checkpoint's weights: `python -m fleetrl.launch.export --checkpoint=... --output=model.pt`.

The file holds the agent's state_dict under "model" plus "problem", "hparams" and
"policy_version", and loads with `torch.load(path, weights_only=True)`:

    problem = load_problem(w["problem"], w["hparams"]); agent = problem.make_agent()
    agent.load_state_dict(w["model"])
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

from fleetrl.learner.checkpoint import CheckpointError, export_weights

flags.DEFINE_string("checkpoint", None, "A checkpoint file (ckpt-*.pt or best.pt).")
flags.DEFINE_string("output", "model.pt", "Where to write the weights.")
FLAGS = flags.FLAGS


def main(argv: list[str]) -> int:
    del argv
    try:
        exported = export_weights(FLAGS.checkpoint or "", FLAGS.output)
    except CheckpointError as e:
        logging.error("%s", e)
        return 2
    print(f"exported {exported['problem']} at policy version {exported['policy_version']:,} to {FLAGS.output}")
    return 0


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))
