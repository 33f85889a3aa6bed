"""The Problem registry and typed --hparams."""

import dataclasses

import pytest

from fleetrl.problems import load_problem, problem_class, registered_names
from fleetrl.problems.cartpole import CartPoleProblem
from fleetrl.problems.hparams import apply_hparams, parse_hparams
from fleetrl.problems.registry import UnknownProblemError


def test_names_and_import_paths_resolve_to_the_same_class():
    assert problem_class("cartpole") is CartPoleProblem
    assert problem_class("fleetrl.problems.cartpole:CartPoleProblem") is CartPoleProblem


def test_unknown_problem_lists_the_registered_names():
    with pytest.raises(UnknownProblemError) as info:
        problem_class("cartpol")
    assert "'cartpol'" in str(info.value)
    for name in registered_names():
        assert name in str(info.value)
    with pytest.raises(UnknownProblemError, match="cannot import module 'no_such_pkg.mod'"):
        problem_class("no_such_pkg.mod:Problem")
    with pytest.raises(UnknownProblemError, match="no Problem subclass named 'Nope'"):
        problem_class("fleetrl.problems.cartpole:Nope")


def test_hparams_are_typed():
    assert parse_hparams("learning_rate=3e-4,hidden_sizes=[128,128], max_episode_steps=200") == {
        "learning_rate": "3e-4", "hidden_sizes": "[128,128]", "max_episode_steps": "200"}
    problem = load_problem("cartpole", parse_hparams("learning_rate=3e-4,hidden_sizes=[128,128]"))
    assert problem.config.learning_rate == 3e-4 and problem.config.hidden_sizes == (128, 128)
    assert problem.make_agent().policy.in_features == 128


def test_bad_hparams_name_the_problem():
    config = CartPoleProblem.Config()
    with pytest.raises(ValueError, match=r"unknown hparams \['learning_rat'\] for CartPoleConfig; did you mean "
                                         r"'learning_rate' for 'learning_rat'\?"):
        apply_hparams(config, {"learning_rat": "1"})
    with pytest.raises(ValueError, match="learning_rate='fast': expected float"):
        apply_hparams(config, {"learning_rate": "fast"})
    with pytest.raises(ValueError, match="not of the form key=value"):
        parse_hparams("learning_rate")


@pytest.mark.parametrize("text,field,value", [
    ("scans=[scan_a,scan_b]", "scans", ("scan_a", "scan_b")),  # no quotes needed
    ('scans=["scan_a", "scan_b"]', "scans", ("scan_a", "scan_b")),  # JSON works too
    ("eval_splits=[test]", "eval_splits", ("test",)),
    ("eval_splits=test", "eval_splits", ("test",)),  # a single item without brackets
    ("scans=[]", "scans", ()),
    ("scans=[a,b],eval_splits=[val_seen]", "scans", ("a", "b")),
])
def test_list_hparams_take_bare_items(text, field, value):
    assert getattr(load_problem("r2r", parse_hparams(text)).config, field) == value


def test_a_malformed_list_shows_the_accepted_syntax():
    with pytest.raises(ValueError, match=r"hidden_sizes='a': expected int; a list is written in brackets with its "
                                         r"items separated by commas, such as hidden_sizes=\[64,64\]"):
        apply_hparams(CartPoleProblem.Config(), {"hidden_sizes": "[a,b]"})
    assert apply_hparams(CartPoleProblem.Config(), {"hidden_sizes": "(32, 16)"}).hidden_sizes == (32, 16)


def test_problems_hold_only_their_config():
    problem = load_problem("cartpole")
    problem.make_agent()
    problem.observation_specs()
    state = {k for k in vars(problem) if not k.startswith("_")}
    assert state == {"config"} and dataclasses.is_dataclass(problem.config)
