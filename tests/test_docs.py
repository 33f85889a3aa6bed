"""The docs stay true: the flag reference is generated from the configs, every documented
command takes its flags, and the examples' --hparams apply to their Problems as written."""

import json
import os
import re
import shlex
import subprocess
import sys

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


# The Problem a page's examples mean when they do not name one.
PAGE_PROBLEMS = {"r2r.md": "r2r", "libero.md": "libero", "gym_cards.md": "gym_cards/numberline"}


def test_every_documented_hparams_example_applies_to_its_problem(repo_root):
    checked = 0
    for name, example in examples(repo_root):
        hparams = re.search(r"--hparams=('[^']*'|\"[^\"]*\"|\S+)", example).group(1).strip("'\"")
        problem = re.search(r"--problems?=([^\s,]+)", example)  # the benches take a list
        problem = problem.group(1) if problem else PAGE_PROBLEMS.get(name, "cartpole")
        if ":" in problem:  # a user's own Problem, defined in the docs' text
            continue
        try:
            load_problem(problem, parse_hparams(hparams))
        except ValueError as e:
            pytest.fail(f"{name}: {example!r} fails: {e}")
        checked += 1
    assert checked >= 3  # the README has several; a pattern that matched none would check nothing


def documented_commands(repo_root) -> list[tuple[str, list[str]]]:
    """(file, argv after `python -m`) of every fleetrl command in README.md and docs/,
    continuation lines joined, trailing shell comments dropped; each distinct one once."""
    found: dict[tuple[str, ...], str] = {}
    for path in [repo_root / "README.md", *sorted((repo_root / "docs").glob("*.md"))]:
        text = path.read_text().replace("\\\n", " ")
        for match in re.finditer(r"python -m (fleetrl\.[\w.]+)([^\n`]*)", text):
            argv = [match.group(1), *shlex.split(match.group(2).split(" #")[0])]
            found.setdefault(tuple(argv), path.name)
    return [(name, list(argv)) for argv, name in found.items()]


def grouped_by_module_and_problem(commands: list[tuple[str, list[str]]]) -> list[tuple[list[str], list[str]]]:
    """(names, argv) with the flags of every command of one module and one --problem joined:
    absl parses each occurrence of a flag, so one process checks them all, and the Problem,
    which decides what flags exist, is the same for each."""
    groups: dict[tuple[str, str | None], tuple[list[str], list[str]]] = {}
    for name, argv in commands:
        problem = next((arg for arg in argv if arg.startswith("--problem=")), None)
        names, joined = groups.setdefault((argv[0], problem), ([], [argv[0]]))
        names.append(f"{name}: {shlex.join(argv)}")
        joined += [arg for arg in argv[1:] if arg not in joined]
    return list(groups.values())


def test_every_documented_command_takes_its_flags(repo_root, tmp_path):
    """Each command's flags parsed by its own entry point, which then stops: a stale module,
    an unknown flag or a bad value fails as it would for a user. One interpreter imports
    torch and fleetrl once and forks a child per command (tests/parse_commands.py)."""
    commands = documented_commands(repo_root)
    assert len(commands) >= 15 and {argv[0] for _, argv in commands} >= {
        "fleetrl.launch.local", "fleetrl.launch.evaluate", "fleetrl.launch.learner", "fleetrl.launch.actor",
        "fleetrl.launch.ray", "fleetrl.launch.export", "fleetrl.launch.r2r_synthetic", "fleetrl.bench.throughput"}

    groups = grouped_by_module_and_problem(commands)
    results = parsed(repo_root, tmp_path, [argv for _, argv in groups])
    assert len(results) == len(groups)
    failed = [f"{chr(10).join(names)}\n{output}" for (names, _), (code, output) in zip(groups, results)
              if not (code == 0 and output.rstrip().endswith("PARSED"))]
    assert not failed, "\n\n".join(failed)


def parsed(repo_root, cwd, commands: list[list[str]]) -> list[tuple[int, str]]:
    """[exit code, output] of each command parsed by tests/parse_commands.py. The docs' own
    example Problems (docs/examples, which their commands put on PYTHONPATH) are importable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo_root / "docs" / "examples"),
                                                         os.environ.get("PYTHONPATH", "")])}
    helper = subprocess.run([sys.executable, str(repo_root / "tests" / "parse_commands.py")],
                            input=json.dumps(commands), capture_output=True, text=True, timeout=300, cwd=cwd, env=env)
    assert helper.returncode == 0, helper.stderr
    return json.loads(helper.stdout)


def test_the_parse_check_fails_a_stale_flag_a_bad_value_or_a_module_that_is_gone(repo_root, tmp_path):
    commands = [["fleetrl.launch.local", "--problem=cartpole", "--no_such_flag=1"],
                ["fleetrl.launch.local", "--problem=libero", "--num_actors=two"], ["fleetrl.launch.no_such_module"],
                ["fleetrl.bench.r2r_baselines", "--no_such_argument"],
                ["fleetrl.launch.local", "--problem=libero", "--suite=libero_10"]]
    unknown, bad_value, gone, argparse_unknown, good = parsed(repo_root, tmp_path, commands)
    assert unknown[0] == 1 and "Unknown command line flag 'no_such_flag'" in unknown[1], unknown
    assert bad_value[0] == 1 and "flag --num_actors=two" in bad_value[1], bad_value
    assert gone[0] != 0 and "No module named fleetrl.launch.no_such_module" in gone[1], gone
    assert argparse_unknown[0] == 2 and "unrecognized arguments: --no_such_argument" in argparse_unknown[1]
    assert good == [0, "PARSED\n"], good  # a Problem's own flag (libero's --suite)


TRAINING_MODULES = {"fleetrl.launch.local", "fleetrl.launch.learner", "fleetrl.launch.ray", "fleetrl.launch.debug"}


def test_every_documented_training_command_has_a_step_budget(repo_root):
    """A run with no budget runs forever on a seed that never reaches its target."""
    commands = [(name, argv) for name, argv in documented_commands(repo_root)
                if argv[0] in TRAINING_MODULES and len(argv) > 1]  # a bare module named in prose is no command
    unbounded = [f"{name}: {shlex.join(argv)}" for name, argv in commands
                 if not any(arg.startswith("--total_env_steps=") for arg in argv)]
    assert len(commands) >= 20 and not unbounded, unbounded


def test_joined_commands_keep_every_flag_and_apart_what_another_problem_defines():
    commands = [("a.md", ["fleetrl.launch.local", "--problem=r2r", "--seed=1"]),
                ("b.md", ["fleetrl.launch.local", "--problem=r2r", "--seed=1", "--num_actors=2"]),
                ("c.md", ["fleetrl.launch.local", "--problem=libero", "--seed=1"]),
                ("d.md", ["fleetrl.launch.evaluate", "--checkpoint=x"])]
    groups = grouped_by_module_and_problem(commands)
    assert [argv for _, argv in groups] == [
        ["fleetrl.launch.local", "--problem=r2r", "--seed=1", "--num_actors=2"],
        ["fleetrl.launch.local", "--problem=libero", "--seed=1"],
        ["fleetrl.launch.evaluate", "--checkpoint=x"]]
    assert groups[0][0] == ["a.md: fleetrl.launch.local --problem=r2r --seed=1",
                            "b.md: fleetrl.launch.local --problem=r2r --seed=1 --num_actors=2"]


@pytest.mark.slow
def test_the_readmes_own_problem_learns_with_the_defaults(repo_root, tmp_path, local_run):
    """The README's example Problem, copied from it, run by its documented command."""
    readme = (repo_root / "README.md").read_text()
    code = re.search(r"```python\n(# my_pkg/nav.py\n.*?)```", readme, re.S).group(1)
    command = re.search(r"PYTHONPATH=\. \.venv/bin/python -m fleetrl\.launch\.local ([^\n]+)",
                        readme.replace("\\\n", " ")).group(1)
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "nav.py").write_text(code)
    summary = local_run.train_to_target(tmp_path / "run", *shlex.split(command), pythonpath=tmp_path, cwd=tmp_path)
    assert summary["mean_episode_return"] >= -120  # random play: -500


def test_every_relative_link_in_the_docs_reaches_a_file(repo_root):
    pages = [repo_root / "README.md", repo_root / "BUILD.md", *sorted((repo_root / "docs").rglob("*.md"))]
    checked, broken = 0, []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            checked += 1
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(repo_root)} -> {target}")
    assert not broken, broken
    assert checked >= 20


def test_the_code_walks_name_files_and_functions_that_exist(repo_root):
    """docs/algorithms.md's PPO and V-trace walks and docs/architecture.md's map name files
    and the functions to search for: each must still exist, or the walk misleads."""
    import re

    paths = [path for path in repo_root.rglob("*") if ".venv" not in path.parts and ".git" not in path.parts]
    sources = "\n".join(path.read_text() for path in paths if path.suffix == ".py")
    relative = {path.relative_to(repo_root).as_posix() + ("/" if path.is_dir() else "") for path in paths}
    missing = []
    for doc in ("docs/algorithms.md", "docs/architecture.md"):
        text = (repo_root / doc).read_text()
        if doc.endswith("algorithms.md"):
            text = text[text.index("## One PPO batch"):text.index("## Episode ends")]
        for name in re.findall(r"`([^`\s]+)`", text):
            if name.endswith((".py", "/")):  # a path from the root, or within the room a table names
                if not any(path == name or path.endswith("/" + name) for path in relative):
                    missing.append(f"{doc}: {name}")
            elif re.fullmatch(r"[A-Z]\w*\.\w+", name):  # Class.method or Class.attribute
                cls, member = name.split(".")
                if f"class {cls}" not in sources or not re.search(rf"def {member}\b|self\.{member} =", sources):
                    missing.append(f"{doc}: {name}")
            elif re.fullmatch(r"[a-z]+_[a-z_]+", name) and name not in sources:
                missing.append(f"{doc}: {name}")
    assert len(re.findall(r"`[^`\s]+\.py`", (repo_root / "docs/algorithms.md").read_text())) > 10
    assert not missing, "named in the docs but not in the code: " + ", ".join(missing)
