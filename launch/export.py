"""Exports a checkpoint's weights: `python -m fleetrl.launch.export --checkpoint=... --output=model.pt`.

The file holds the agent's state_dict under "model" plus "problem", "hparams" and
"policy_version", and loads with `torch.load(path, weights_only=True)`:

    problem = load_problem(w["problem"], w["hparams"]); agent = problem.make_agent()
    agent.load_state_dict(w["model"])

For a vision-language agent, `--pretrained_dir=DIR` also writes the fine-tuned model as a
folder that `AutoModelForImageTextToText.from_pretrained(DIR)` loads, LoRA merged in. For a
flow-matching VLA (pi0, pi0.5), DIR is openpi's checkpoint layout (model.safetensors with
openpi's keys, config.json, assets/<asset_id>/norm_stats.json; LoRA merged), which openpi,
LeRobot and RLinf serve, with fleetrl's value head and settings beside it;
`fleetrl.agents.pi0.flow_vla_agent.load_exported(DIR)` builds the policy again.
"""

from __future__ import annotations

from absl import logging

from fleetrl.launch.configs import ExportConfig
from fleetrl.launch.flags import define_flags, from_flags, run_main
from fleetrl.learner.run.checkpoint import export_weights, resolve_checkpoint
from fleetrl.problems.registry import load_problem, trusted_problem_class

define_flags(ExportConfig)


def main(argv: list[str]) -> int:
    del argv
    try:
        config = from_flags(ExportConfig)
        exported = export_weights(resolve_checkpoint(config.checkpoint), config.output)
        if config.pretrained_dir:
            export_pretrained(exported, config.pretrained_dir, config.problem or None)
    except ValueError as e:  # no --checkpoint, not a readable checkpoint, not a pretrained model
        logging.error("%s", e)
        return 2
    print(f"exported {exported['problem']} at policy version {exported['policy_version']:,} to {config.output}")
    if config.pretrained_dir:
        print(f"wrote the merged model to {config.pretrained_dir}")
    return 0


def export_pretrained(exported: dict, directory: str, problem: str | None = None) -> None:
    """The agent of `exported` written as a pretrained folder; `problem`: the user's own
    Problem that rebuilds it, else the checkpoint's, which must be a registered one."""
    if problem is None:
        trusted_problem_class(exported["problem"], "the checkpoint")
    agent = load_problem(problem or exported["problem"], exported["hparams"]).make_agent()
    if not hasattr(agent, "export_pretrained"):
        raise ValueError(f"--pretrained_dir: {exported['problem']}'s agent ({type(agent).__name__}) is not a "
                         f"pretrained transformers model; the weights file is all there is to export")
    agent.load_state_dict(exported["model"])
    agent.export_pretrained(directory)


def run() -> None:
    run_main(main, __doc__)


if __name__ == "__main__":
    run()
