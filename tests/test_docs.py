"""The docs stay true: the flag reference is generated from the configs, and the examples'
--hparams parse and apply to their Problems as written."""

import re

import pytest

from fleetrl.launch import flag_docs
from fleetrl.problems import load_problem
from fleetrl.problems.hparams import parse_hparams


def test_the_flag_reference_is_generated_from_the_configs(repo_root):
    assert (repo_root / "docs" / "flags.md").read_text() == flag_docs.render(), \
        "docs/flags.md is stale: run python -m fleetrl.launch.flag_docs"


def examples(repo_root) -> list[tuple[str, str]]:
    """(file, text) of every command block line and inline code span in README.md and docs/
    that sets --hparams, continuation lines joined; placeholders ("...") left out."""
    found = []
    for path in [repo_root / "README.md", *sorted((repo_root / "docs").glob("*.md"))]:
        text = path.read_text().replace("\\\n", " ")
        spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"(?m)^.*python -m fleetrl\..*$", text)
        found += [(path.name, span) for span in spans if "--hparams=" in span and "..." not in span]
    return found


def test_every_documented_hparams_example_applies_to_its_problem(repo_root):
    checked = 0
    for name, example in examples(repo_root):
        hparams = re.search(r"--hparams=('[^']*'|\"[^\"]*\"|\S+)", example).group(1).strip("'\"")
        problem = re.search(r"--problem=(\S+)", example)
        problem = problem.group(1) if problem else "cartpole"  # the README's examples without one are CartPole's
        if ":" in problem:  # a user's own Problem, defined in the docs' text
            continue
        try:
            load_problem(problem, parse_hparams(hparams))
        except ValueError as e:
            pytest.fail(f"{name}: {example!r} fails: {e}")
        checked += 1
    assert checked >= 3  # the README has several; a pattern that matched none would check nothing
