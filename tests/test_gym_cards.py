"""gym_cards: every rule, reward and termination with hand-made cases, the parser, and rendering."""

import json
import subprocess
import sys
from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest
import torch

from fleetrl.envs.gym_cards import BlackjackEnv, EZPointsEnv, NumberLineEnv, Points24Env, text_to_action
from fleetrl.envs.gym_cards.arithmetic import FormulaError, evaluate, solvable
from fleetrl.problems import load_problem

SIZE = 48


def numberline(target, current):
    env = NumberLineEnv(image_size=SIZE)
    env.reset(seed=0)
    env.target, env.current = target, current
    return env


def test_numberline_rewards_progress_punishes_the_rest_and_ends_at_the_target():
    env = numberline(target=3, current=1)
    assert env.step(1)[1:4] == (0.0, False, False)  # closer
    assert env.step(0)[1:4] == (-1.0, False, False)  # farther
    env.step(1)
    _, reward, terminated, truncated, info = env.step(1)
    assert (reward, terminated, truncated) == (1.0, True, False) and info["text"] == "Target: 3\nCurrent: 3"
    assert info["legal_actions"] == ["-", "+"]


def test_numberline_stays_on_the_line_and_truncates_after_twice_its_length():
    env = numberline(target=5, current=0)
    assert env.step(0)[1] == -1.0 and env.current == 0  # a bump at the edge is no progress
    for _ in range(8):
        _, _, terminated, truncated, _ = env.step(0)
    assert env.steps == 9 and not truncated
    _, _, terminated, truncated, _ = env.step(0)
    assert truncated and not terminated


def test_numberline_starts_away_from_its_target():
    env = NumberLineEnv(image_size=SIZE)
    for seed in range(50):
        env.reset(seed=seed)
        assert env.target != env.current and 0 <= env.target <= 5 and 0 <= env.current <= 5


def formula_env(cls, ranks):
    env = cls(image_size=SIZE)
    env.reset(seed=0)
    env.ranks = list(ranks)
    env.unused = [min(r, 10) for r in ranks]
    return env


def play(env, tokens):
    results = []
    for token in tokens:
        results.append(env.step(env.ACTIONS.index(token))[1:4])
    return results


@pytest.mark.parametrize("ranks,tokens,last", [
    ((6, 2), "6*2=", (10.0, True, False)),
    ((6, 6), "6+6=", (10.0, True, False)),
    ((12, 2), ["10", "+", "2", "="], (10.0, True, False)),  # a queen counts 10
    ((6, 2), "6+2=", (-1.0, True, False)),  # wrong value
    ((6, 2), "6*=", (-1.0, True, False)),  # not a formula
    ((6, 6), "6+=", (-1.0, True, False)),
])
def test_ezpoints_formulas(ranks, tokens, last):
    env = formula_env(EZPointsEnv, ranks)
    results = play(env, list(tokens))
    assert all(r == (0.0, False, False) for r in results[:-1]) and results[-1] == last


def test_ezpoints_needs_both_cards_and_refuses_numbers_it_does_not_hold():
    env = formula_env(EZPointsEnv, (6, 2))
    assert play(env, ["6", "6"])[1] == (-1.0, False, False)  # an illegal repeat: -1, the episode goes on
    assert play(env, ["3"])[0] == (-1.0, False, False)  # not a card
    assert env.formula == ["6"]
    env = formula_env(EZPointsEnv, (3, 4))
    assert play(env, ["1", "2"])[-1] == (-1.0, False, False)
    env = formula_env(EZPointsEnv, (6, 6))
    assert play(env, ["6", "*", "2", "="])[-1] == (-1.0, True, False)  # 2 is no card here


def test_ezpoints_truncates_formulas_longer_than_five_tokens():
    env = formula_env(EZPointsEnv, (6, 2))
    results = play(env, ["6", "+", "+", "+", "+", "+"])
    assert results[:5] == [(0.0, False, False)] * 5 and results[5] == (-1.0, False, True)


def test_ezpoints_deals_pairs_that_make_twelve():
    env = EZPointsEnv(image_size=SIZE)
    for seed in range(100):
        env.reset(seed=seed)
        a, b = (min(r, 10) for r in env.ranks)
        assert a + b == 12 or a * b == 12


def test_points24_formulas_with_every_operator():
    env = formula_env(Points24Env, (4, 7, 8, 8))
    assert play(env, ["(", "7", "-", "8", "/", "8", ")", "*", "4", "="])[-1] == (10.0, True, False)  # (7-1)*4
    env = formula_env(Points24Env, (13, 3, 5, 1))  # (10 + 5 - 3) * 1 ... = 12, not 24
    assert play(env, ["(", "10", "+", "5", "-", "3", ")", "*", "1", "="])[-1] == (-1.0, True, False)
    env = formula_env(Points24Env, (3, 3, 8, 8))
    assert play(env, ["8", "/", "(", "3", "-", "8", "/", "3", ")", "="])[-1] == (10.0, True, False)
    env = formula_env(Points24Env, (1, 2, 3, 4))
    assert play(env, ["1", "*", "2", "*", "3", "*", "4", "="])[-1] == (10.0, True, False)


def test_points24_truncates_after_twenty_tokens():
    env = formula_env(Points24Env, (1, 2, 3, 4))
    results = play(env, ["("] * 21)
    assert results[19] == (0.0, False, False) and results[20] == (-1.0, False, True)


def test_points24_solvable_only_deals_solvable_hands():
    env = Points24Env(image_size=SIZE, solvable_only=True)
    for seed in range(30):
        env.reset(seed=seed)
        assert solvable(tuple(sorted(min(r, 10) for r in env.ranks)))
    assert solvable((3, 3, 8, 8)) and not solvable((1, 1, 1, 1))


def test_arithmetic_is_exact_and_refuses_malformed_formulas():
    assert evaluate(["8", "/", "(", "3", "-", "8", "/", "3", ")"]) == 24
    assert evaluate(["2", "+", "3", "*", "4"]) == 14
    assert evaluate(["1", "/", "3"]) == Fraction(1, 3)
    for bad in (["("], ["1", "+"], ["1", ")"], ["*", "2"], ["1", "/", "(", "1", "-", "1", ")"], []):
        with pytest.raises(FormulaError):
            evaluate(bad)


def test_blackjack_follows_gymnasium_and_shows_the_dealers_hidden_card_face_down():
    env = BlackjackEnv(image_size=SIZE)
    obs, info = env.reset(seed=3)
    assert info["legal_actions"] == ["stand", "hit"] and info["text"].startswith("Dealer: ")
    reference = gym.make("Blackjack-v1", natural=False, sab=False).unwrapped
    reference.reset(seed=int(np.random.default_rng(3).integers(2**31)))  # what reset(seed=3) deals
    assert env.game.player == reference.player and env.game.dealer == reference.dealer
    _, reward, terminated, _, _ = env.step(0)  # stick: the dealer plays out, the hand ends
    _, want, _, _, _ = reference.step(0)
    assert terminated and reward == want


def test_blackjack_busting_loses():
    env = BlackjackEnv(image_size=SIZE)
    env.reset(seed=0)
    env.game.player = [10, 10]
    _, reward, terminated, _, _ = env.step(1)
    assert terminated and reward == -1.0 and sum(env.game.player) > 21


@pytest.mark.parametrize("cls", [NumberLineEnv, EZPointsEnv, Points24Env, BlackjackEnv])
def test_images_are_deterministic_for_a_seed_and_show_the_state(cls):
    a, b = cls(image_size=SIZE), cls(image_size=SIZE)
    obs_a, _ = a.reset(seed=7)
    obs_b, _ = b.reset(seed=7)
    assert obs_a["image"].shape == (SIZE, SIZE, 3) and obs_a["image"].dtype == np.uint8
    assert np.array_equal(obs_a["image"], obs_b["image"])
    different = next(s for s in range(8, 100) if b.reset(seed=s)[1]["text"] != a.reset(seed=7)[1]["text"])
    assert not np.array_equal(a.reset(seed=7)[0]["image"], b.reset(seed=different)[0]["image"])


def test_different_cards_draw_different_images():
    env = formula_env(EZPointsEnv, (6, 2))
    first = env.render()
    env.ranks = [4, 3]
    assert not np.array_equal(first, env.render())
    env.suits = ["hearts", "hearts"]
    second = env.render()
    env.suits = ["spades", "spades"]
    assert not np.array_equal(second, env.render())


@pytest.mark.parametrize("text,legal,want", [
    ('thoughts... "action": "+"', ["-", "+"], 1),
    ('"ACTION": "Hit"', ["stand", "hit"], 1),
    ('"action": "10"', [str(n) for n in range(1, 11)], 9),  # "1" does not occur in "10"
    ('I think 1 is wrong. "action": "7"', [str(n) for n in range(1, 11)], 6),  # only after the marker
])
def test_the_parser_takes_the_one_legal_action_after_the_marker(text, legal, want):
    parsed = text_to_action(text, legal, np.random.default_rng(0))
    assert (parsed.index, parsed.parse_failed) == (want, False)


@pytest.mark.parametrize("text", ['"action": "hit or stand"', 'no marker: hit', '"action": "fold"', ""])
def test_the_parser_falls_back_to_a_uniform_legal_action_and_says_so(text):
    rng = np.random.default_rng(0)
    picks = [text_to_action(text, ["stand", "hit"], rng) for _ in range(400)]
    assert all(p.parse_failed for p in picks)
    assert 150 < sum(p.index for p in picks) < 250  # about half each


@pytest.mark.parametrize("name", ["gym_cards/numberline", "gym_cards/ezpoints", "gym_cards/points24",
                                  "gym_cards/blackjack"])
def test_each_task_is_a_registered_problem_with_an_image_agent(name):
    problem = load_problem(name, {"image_size": "32"})
    (spec,) = problem.observation_specs()
    assert (spec.name, spec.shape) == ("image", (32, 32, 3))
    env = problem.make_actor_env()
    obs, _ = env.reset(seed=0)
    done = False
    while not done:
        obs, _, terminated, truncated, info = env.step(env.action_space.sample())
        done = terminated or truncated
    assert problem.episode_metrics(info)["success"] in (0.0, 1.0)
    assert gym.make(f"fleetrl/{type(env.unwrapped).__name__[:-3]}-v0", image_size=32).reset(seed=0)[0]["image"].shape \
        == (32, 32, 3)


@pytest.mark.slow
def test_numberline_is_learned_from_pixels_through_the_whole_system(tmp_path, local_run):
    """PPO from 32x32 images, real learner and actors. The deterministic policy of a fresh
    agent succeeds on about half the episodes (always "+" or always "-"), a random one on
    about a quarter; the published CNN baseline reaches 87%. With the running pixel
    normalization, 12 seeds of 12 first reached 95% by 2.8k env steps; the run stops at an
    eval round of 97%, within 15k env steps."""

    process, tag = local_run.start(tmp_path, "--problem=gym_cards/numberline", "--seed=0", "--total_env_steps=15000",
                                   "--num_eval_actors=1", "--eval_interval_s=10", "--best_metric=success",
                                   "--target_eval_metric=0.97")
    code, output = local_run.finish(process, tag)
    assert code == 0, output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["target_reached"] and summary["reason"].startswith("target reached: eval success"), summary
    best = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)
    # The Problem's learner_defaults reached the learner, since no flag set them.
    assert best["learner_config"]["block_inference_on_training"] is True
    assert best["learner_config"]["batch_size"] == 32
    result = subprocess.run([sys.executable, "-m", "fleetrl.launch.evaluate",
                             f"--checkpoint={tmp_path / 'checkpoints' / 'best.pt'}",
                             "--episodes=300", "--num_envs=32", f"--output={tmp_path / 'eval-300'}"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    metrics = json.loads((tmp_path / "eval-300" / "metrics.json").read_text())
    assert metrics["episodes"] == 300
    assert metrics["metrics"]["success"] >= 0.9, metrics


@pytest.mark.slow
def test_ezpoints_is_learned_from_the_solver_then_with_rl(tmp_path, local_run):
    """The recipe of docs/gym_cards.md: imitate the solver alone, then warm-start a run
    that mixes PPO with teacher-forced episodes. RL alone stays at 0%. No teacher at eval.
    The stages are shorter than the recipe's 20k and 15k env steps (100% on 300 episodes): on
    2026-12-03, 10k of imitation gave 92% and 6k of mixed RL after it 75%; the bar is 40%."""

    process, tag = local_run.start(tmp_path / "imitate", "--problem=gym_cards/ezpoints", "--seed=0",
                                   "--teacher_forcing_fraction=1", "--algorithm=supervised",
                                   "--total_env_steps=10000")
    code, output = local_run.finish(process, tag)
    assert code == 0, output
    process, tag = local_run.start(tmp_path / "rl", "--problem=gym_cards/ezpoints", "--seed=0",
                                   "--teacher_forcing_fraction=0.5", f"--init_checkpoint={tmp_path / 'imitate'}",
                                   "--total_env_steps=8000")
    code, output = local_run.finish(process, tag)
    assert code == 0, output
    latest = sorted((tmp_path / "rl" / "checkpoints").glob("ckpt-*.pt"))[-1]
    assert torch.load(latest, weights_only=True)["learner_config"]["init_checkpoint"] == str(tmp_path / "imitate")
    result = subprocess.run([sys.executable, "-m", "fleetrl.launch.evaluate", f"--checkpoint={tmp_path / 'rl'}",
                             "--episodes=300", "--num_envs=32", f"--output={tmp_path / 'eval-300'}"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    metrics = json.loads((tmp_path / "eval-300" / "metrics.json").read_text())
    assert metrics["episodes"] == 300 and metrics["hparams"]["teacher_forcing_fraction"] == "0.5"
    assert metrics["metrics"]["success"] >= 0.4, metrics["metrics"]


# ----- the solvers: teacher forcing's oracles and the warm starts' demonstrations -----

@pytest.mark.parametrize("env_id,kwargs", [("fleetrl/NumberLine-v0", {}), ("fleetrl/EZPoints-v0", {}),
                                           ("fleetrl/Points24-v0", {"solvable_only": True})])
def test_playing_the_solvers_text_answers_solves_every_deal(env_id, kwargs):
    """Each answer is in the prompts' format and names a legal action; played through the
    text parser, the answers solve every episode."""
    from fleetrl.envs.gym_cards.solvers import solve
    from fleetrl.envs.text_to_action import text_to_action

    env = gym.make(env_id, image_size=16, **kwargs)
    rng = np.random.default_rng(0)
    for episode in range(20):
        _, info = env.reset(seed=episode)
        for _ in range(20):
            answer = json.loads(solve(env.unwrapped).text())
            assert set(answer) == {"thoughts", "action"} and answer["thoughts"]
            parsed = text_to_action(solve(env.unwrapped).text(), list(info["legal_actions"]), rng)
            assert not parsed.parse_failed, answer
            _, reward, terminated, truncated, info = env.step(parsed.index)
            if terminated or truncated:
                break
        assert terminated and reward > 0, (episode, answer)


@pytest.mark.parametrize("player,dealer,action", [
    ((10, 6), 10, "hit"), ((10, 6), 6, "stand"), ((10, 2), 3, "hit"), ((10, 2), 4, "stand"),
    ((5, 6), 10, "hit"), ((10, 7), 1, "stand"), ((1, 7), 9, "hit"), ((1, 7), 7, "stand"), ((1, 6), 2, "hit"),
    ((1, 8), 10, "stand"), ((10, 9, 1), 10, "stand"),
])
def test_the_blackjack_solver_plays_basic_strategy(player, dealer, action):
    from fleetrl.envs.gym_cards.solvers import solve

    env = gym.make("fleetrl/Blackjack-v0", image_size=16).unwrapped
    env.reset(seed=0)
    env.game.player, env.game.dealer = list(player), [dealer, 5]
    answer = solve(env)
    assert answer.action == action, answer.thoughts
    assert f"shows {'an ace' if dealer == 1 else dealer}" in answer.thoughts


def test_a_noisy_solver_names_the_right_action_as_often_as_asked():
    from fleetrl.envs.gym_cards.oracle import SolverOracle
    from fleetrl.envs.gym_cards.solvers import solve

    env = SolverOracle(gym.make("fleetrl/NumberLine-v0", image_size=16), accuracy=0.6)
    right = total = 0
    obs, info = env.reset(seed=0)
    for _ in range(2000):
        best = solve(env.unwrapped)
        text = bytes(obs["oracle_text"][:obs["oracle_text_length"]]).decode()
        answer = json.loads(text)
        assert answer["thoughts"] == best.thoughts  # the thoughts stay right; the action may not
        assert info["legal_actions"][obs["oracle_action"]] == answer["action"]
        right += answer["action"] == best.action
        total += 1
        obs, _, terminated, truncated, info = env.step(int(obs["oracle_action"]))
        if terminated or truncated:
            obs, info = env.reset()
    assert abs(right / total - 0.6) < 0.04


def test_the_solver_answers_in_the_last_state_of_a_formula_episode_too():
    """An oracle observes the state after the episode's last step as well (the vector env
    resets only after it): the solver must answer there, not fail."""
    from fleetrl.envs.gym_cards.solvers import solve

    env = gym.make("fleetrl/EZPoints-v0", image_size=16)
    _, info = env.reset(seed=0)
    terminated = False
    while not terminated:
        action = solve(env.unwrapped).action
        _, _, terminated, _, info = env.step(list(info["legal_actions"]).index(action))
    assert solve(env.unwrapped).action == "="
