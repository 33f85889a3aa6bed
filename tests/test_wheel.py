"""The wheel a user installs: every module, every built-in Problem, every script's --help.

Built from the files a clean clone holds, installed with the pinned torch
into a fresh virtualenv, and run from a folder outside the repository, so nothing here can
lean on the source tree. Features whose extras are not installed must fail with a message
that names the extra, never with a bare traceback.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fleetrl.problems import registered_names

# Builds and installs a wheel (about a minute), then a run per Problem.
pytestmark = [pytest.mark.slow, pytest.mark.file_fixture]

IMPORT_EVERY_MODULE = textwrap.dedent("""
    import importlib, json, pkgutil
    import fleetrl
    from fleetrl.common.extras import MissingExtra
    results = {}
    for module in pkgutil.walk_packages(fleetrl.__path__, "fleetrl."):
        try:
            importlib.import_module(module.name)
            results[module.name] = "ok"
        except MissingExtra as e:
            results[module.name] = f"extra {e.extra}: {e}"
        except Exception as e:
            results[module.name] = f"error: {type(e).__name__}: {e}"
    print(json.dumps({"file": fleetrl.__file__, "modules": results}))
""")


@pytest.fixture(scope="module")
def installed(tmp_path_factory, repo_root):
    """(venv bin folder, a working folder outside the repository)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    # What a clean clone holds: tracked files, and new ones git does not ignore.
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo_root,
                           capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((repo_root / name).read_bytes())

    def run(*command, **kwargs):
        result = subprocess.run(command, capture_output=True, text=True, timeout=900, **kwargs)
        assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
        return result

    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(root / "dist"), str(source))
    (wheel,) = (root / "dist").glob("fleetrl-*.whl")
    run(sys.executable, "-m", "venv", str(root / "venv"))
    bin_dir = root / "venv" / "bin"
    run(str(bin_dir / "python"), "-m", "pip", "install", "-q", "torch==2.13.0")  # the CPU build, as make does
    run(str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel))
    outside = root / "outside"
    outside.mkdir()
    return bin_dir, outside


def test_every_module_imports_or_names_its_extra(installed):
    bin_dir, outside = installed
    result = subprocess.run([str(bin_dir / "python"), "-c", IMPORT_EVERY_MODULE], capture_output=True, text=True,
                            cwd=outside, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert str(bin_dir.parent) in report["file"]  # the installed package, not the source tree
    modules = report["modules"]
    for subpackage in ("envs.gym_cards", "envs.r2r", "envs.libero", "launch", "learner", "common", "problems"):
        assert f"fleetrl.{subpackage}" in modules, subpackage
    errors = {name: result for name, result in modules.items() if result.startswith("error")}
    assert not errors, errors
    extras = {name: result for name, result in modules.items() if result.startswith("extra")}
    assert set(extras) == {"fleetrl.launch.ray", "fleetrl.launch.ray_hosts", "fleetrl.launch.ray_learner_group"}, extras
    assert all("pip install 'fleetrl[ray]'" in message for message in extras.values())


WITH_EXTRAS = {"libero", "libero_flow_vla", "point_reach"} | {n for n in registered_names() if n.endswith("_vlm")}

# Each builtin Problem trains a few updates from the installed files, in one process as
# launch.debug runs it (the learner's parts and the envs, no transport): a file the wheel
# lacks fails its Problem here. The whole system from the wheel is the console script's
# test below; each Problem through gRPC and processes is proven from the source tree.
TRAIN_EACH_PROBLEM = textwrap.dedent("""
    import json, sys
    from fleetrl.launch.configs import DebugConfig, FleetConfig
    from fleetrl.launch.debug_run import DebugRun
    from fleetrl.learner.config import LearnerConfig
    results = {}
    for name in sys.argv[2:]:
        learner = LearnerConfig(problem=name, logdir=f"{sys.argv[1]}/{name.replace('/', '_')}",
                                unroll_length=4, batch_size=4, total_env_steps=200)
        summary = DebugRun(DebugConfig(learner, FleetConfig(num_actors=1, envs_per_actor=2),
                                       progress=False)).run_to_end()
        results[name] = [summary.env_steps, summary.trainer_steps]
    print(json.dumps(results))
""")


def test_every_builtin_problem_trains_from_the_wheel(installed):
    bin_dir, outside = installed
    problems = sorted(set(registered_names()) - WITH_EXTRAS)
    result = subprocess.run([str(bin_dir / "python"), "-c", TRAIN_EACH_PROBLEM, str(outside / "debug"), *problems],
                            capture_output=True, text=True, cwd=outside, timeout=600,
                            env={**os.environ, "PYTHONPATH": ""})
    assert result.returncode == 0, result.stdout + result.stderr
    trained = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(trained) == problems
    assert all(env_steps >= 200 and trainer_steps >= 1 for env_steps, trainer_steps in trained.values()), trained


def test_the_console_script_runs_the_whole_system_from_the_wheel(installed):
    bin_dir, outside = installed
    logdir = outside / "runs" / "cartpole"
    result = subprocess.run(
        [str(bin_dir / "fleetrl-local"), "--problem=cartpole", f"--logdir={logdir}", "--num_actors=1",
         "--envs_per_actor=2", "--unroll_length=4", "--batch_size=4", "--total_env_steps=200",
         "--progress_interval_s=0.5"],
        capture_output=True, text=True, cwd=outside, timeout=600,
        env={**os.environ, "PYTHONPATH": ""})
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["env_steps"] >= 200 and summary["trainer_steps"] >= 1, summary


@pytest.mark.parametrize("problem,extra", [("libero", "libero"), ("gym_cards/numberline_vlm", "vlm"),
                                           ("point_reach", "vlm")])
def test_a_problem_without_its_extra_fails_with_one_clear_message(installed, problem, extra):
    bin_dir, outside = installed
    result = subprocess.run([str(bin_dir / "fleetrl-local"), f"--problem={problem}",
                             f"--logdir={outside / ('run-' + extra)}", "--num_actors=1"],
                            capture_output=True, text=True, cwd=outside, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"needs the '{extra}' extra: pip install 'fleetrl[{extra}]'" in output, output
    assert "Traceback" not in output


@pytest.mark.parametrize("script,flag", [
    ("fleetrl-local", "--num_actors"), ("fleetrl-learner", "--batch_size"), ("fleetrl-actor", "--learner_address"),
    ("fleetrl-evaluate", "--record"), ("fleetrl-export", "--output"),
])
def test_console_scripts_print_their_flags(installed, script, flag):
    bin_dir, outside = installed
    result = subprocess.run([str(bin_dir / script), "--help"], capture_output=True, text=True, cwd=outside,
                            timeout=120)
    assert flag in result.stdout, result.stdout + result.stderr  # (absl exits 1 after --help)
