"""Parses each command of a list as its entry point would, without running it: a script
that test_docs starts.

It imports torch and fleetrl once, then runs each command in a process forked from itself,
as `python -m MODULE ARGS` would (the module as `__main__`, its flags defined anew in the
child), except that absl's `app.run` and argparse's `parse_args` stop once the command line
is parsed, printing PARSED: so each command costs a fork, not an interpreter and a torch
import, and an unknown flag or a bad value fails as it would for a user. (`--help` would
not do: absl and argparse print the help, and exit, before they look at an unknown flag.)
Reads a JSON list of argv (module first) on stdin; writes a JSON list of [exit code, output].
"""

import argparse
import json
import os
import runpy
import sys
import tempfile

import torch  # noqa: F401  (imported once here, inherited by every child)
from absl import app

import fleetrl.launch.flags  # noqa: F401
import fleetrl.problems.registry  # noqa: F401

PARSED = "PARSED"


def parse_and_stop(main, argv=None, flags_parser=app.parse_flags_with_usage) -> None:
    """absl's app.run up to the parse of the flags (a bad flag exits 1 with absl's FATAL line)."""
    flags_parser(sys.argv if argv is None else argv)
    print(PARSED)
    sys.exit(0)


def parse_args_and_stop(self, args=None, namespace=None):
    """argparse's parse_args, then stop (a bad argument exits 2 with argparse's error)."""
    original_parse_args(self, args, namespace)
    print(PARSED)
    sys.exit(0)


original_parse_args = argparse.ArgumentParser.parse_args


def run_in_child(argv: list[str], output_path: str) -> int:
    """Forks, parses `argv` as `python -m` would run it, and returns the child's exit status."""
    pid = os.fork()
    if pid == 0:  # the child: its output goes to the file, its exit code is the command's
        code = 70
        try:
            with open(output_path, "w") as out:
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
            sys.argv = list(argv)
            app.run = parse_and_stop
            argparse.ArgumentParser.parse_args = parse_args_and_stop
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 70
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main() -> None:
    commands = json.load(sys.stdin)
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for i, argv in enumerate(commands):
            path = os.path.join(folder, f"{i}.txt")
            code = run_in_child(argv, path)
            with open(path) as f:
                results.append([code, f.read()])
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
