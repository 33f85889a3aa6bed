"""bench/vlm_action_given_thoughts.py: the wrong answer differs from the solver's only in its
action, and a checkpoint is scored on every NumberLine start state."""

import json

import pytest

from fleetrl.envs.gym_cards.solvers import Answer

pytest.importorskip("transformers", reason="the vlm extra (make install puts it in)")

from fleetrl.bench.vlm_action_given_thoughts import p_right_by_state, swap_action  # noqa: E402
from fleetrl.learner.run.checkpoint import CHECKPOINT_FORMAT, atomic_save  # noqa: E402
from fleetrl.problems import load_problem  # noqa: E402


def test_the_swapped_answer_keeps_every_byte_but_the_action():
    right = Answer("The target is 3 and the current number is 1, so I add one.", "+").text()
    wrong = swap_action(right)
    assert json.loads(wrong) == {"thoughts": json.loads(right)["thoughts"], "action": "-"}
    assert len(wrong) == len(right) and swap_action(wrong) == right
    assert json.loads(swap_action(Answer("Hit below 17.", "hit").text()))["action"] == "stand"
    with pytest.raises(ValueError, match="'7' is not one of a two-action task's"):
        swap_action(Answer("7 + 5 = 12", "7").text())


def test_a_checkpoint_is_scored_on_each_numberline_start_state(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETRL_CACHE", str(tmp_path / "models"))
    hparams = {"observation_text": "true", "lora_rank": "0", "max_new_tokens": "32"}
    agent = load_problem("gym_cards/numberline_vlm", hparams).make_agent()
    path = str(tmp_path / "ckpt.pt")
    atomic_save({"format": CHECKPOINT_FORMAT, "problem": "gym_cards/numberline_vlm", "hparams": hparams,
                 "model": agent.state_dict()}, path)
    p_right = p_right_by_state(path, states=200)
    # Target and current from 0 to 5, never equal at the start: 30 states, each its own thoughts.
    assert len(p_right) == 30 and all(0 < p < 1 for p in p_right.values())
    assert {f"The target is {t} and the current number is {c}," for t in range(6) for c in range(6) if t != c} == \
        {state.split(" so I")[0] for state in p_right}
