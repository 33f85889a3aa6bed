"""How much a VLM checkpoint's action follows its thoughts, on a two-action gym_cards task.

    python -m fleetrl.bench.vlm_action_given_thoughts --checkpoint=/tmp/warm [--checkpoint=/tmp/warm2 ...]

For each start state of `--states` resets, the solver writes the right answer; the same answer
with the other action swapped in is the wrong one. Both are scored with teacher forcing, so
their thoughts are the same tokens, and p(right) = sigmoid(log p(right) - log p(wrong)) is how
strongly the action follows right thoughts. A warm start on a solver that is right 60% of the
time should reach 0.6 (docs/vlm.md); PPO then has to move it to 1. Prints the mean over
distinct start states, and the lowest and highest.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import torch
from absl import app, flags

from fleetrl.bench.vlm_generation import observations
from fleetrl.envs.text_actions import decode_text, encode_text
from fleetrl.learner.run.saved_policy import load_policy

flags.DEFINE_multi_string("checkpoint", [], "A checkpoint file or a run's logdir (its best.pt, else its latest).")
flags.DEFINE_integer("states", 300, "Resets to score (NumberLine has 30 distinct start states).")
FLAGS = flags.FLAGS

OTHER_ACTION = {"+": "-", "-": "+", "stand": "hit", "hit": "stand"}


def swap_action(answer: str) -> str:
    """The answer with its action replaced by the other legal one, every other byte kept."""
    action = json.loads(answer)["action"]
    if action not in OTHER_ACTION:
        raise ValueError(f"the solver's action {action!r} is not one of a two-action task's {sorted(OTHER_ACTION)}")
    head, quoted, tail = answer.rpartition(f'"{action}"')
    return f'{head}"{OTHER_ACTION[action]}"{tail}'


def answer_log_probs(problem, agent, observation: dict[str, torch.Tensor]) -> torch.Tensor:
    """log p of each observation's oracle answer, every token teacher-forced."""
    count = observation["oracle_text"].shape[0]
    with torch.no_grad():
        out, _ = agent.step(observation, torch.zeros(count, dtype=torch.bool), ())
        answers = {k[len("oracle_"):]: v.unsqueeze(0) for k, v in out.items() if k.startswith("oracle_")}
        scored, _ = agent.unroll({k: v.unsqueeze(0) for k, v in observation.items()},
                                 torch.zeros(1, count, dtype=torch.bool), (), answers)
    return problem.action_policy().teacher_forcing_log_prob(scored, answers)[0]


def p_right_by_state(path: str, states: int) -> dict[str, float]:
    # The run's own config, with the oracle always on and always right.
    policy = load_policy(path, {"teacher_forcing_fraction": "1", "solver_accuracy": "1"})
    problem, agent = policy.problem, policy.agent
    right = observations(problem, states)
    answers = [decode_text(text.numpy(), int(length))
               for text, length in zip(right["oracle_text"], right["oracle_text_length"])]
    wrong = dict(right, oracle_text=torch.from_numpy(
        np.stack([encode_text(swap_action(a), right["oracle_text"].shape[1])[0] for a in answers])))
    p_right = torch.sigmoid(answer_log_probs(problem, agent, right) - answer_log_probs(problem, agent, wrong))
    by_state: dict[str, list[float]] = defaultdict(list)
    for answer, p in zip(answers, p_right.tolist()):
        by_state[json.loads(answer)["thoughts"]].append(p)  # the start state, as the solver describes it
    return {state: float(np.mean(ps)) for state, ps in by_state.items()}


def main(argv: list[str]) -> None:
    del argv
    if not FLAGS.checkpoint:
        raise app.UsageError("--checkpoint is required")
    for path in FLAGS.checkpoint:
        values = np.array(list(p_right_by_state(path, FLAGS.states).values()))
        print(f"{path}: {len(values)} start states, p(right | right thoughts) mean {values.mean():.3f}, "
              f"lowest {values.min():.3f}, highest {values.max():.3f}")


def run() -> None:
    app.run(main)


if __name__ == "__main__":
    run()
