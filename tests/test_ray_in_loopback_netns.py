"""The Ray tests (tests/test_launch_ray.py) run in a network namespace that has only
loopback, so that no server they start, Ray's own included, can listen on another address
of this machine (Ray's CLI rewrites --node-ip-address=127.0.0.1: docs/notes/ray_loopback.md).

This driver makes the namespace (`unshare --net`, as root), brings `lo` up, and runs that
module's tests there in a pytest of their own; it passes when they pass, and prints their
output when they do not. Where no namespace can be made (not root), it says so and skips.
"""

import os
import shutil
import subprocess
import sys

import pytest
from conftest import LOOPBACK_NETNS

pytestmark = [pytest.mark.slow, pytest.mark.file_fixture, pytest.mark.netns_driver]

MODULE = os.path.join(os.path.dirname(__file__), "test_launch_ray.py")


def _why_no_namespace() -> str | None:
    if os.geteuid() != 0:
        return "not root: no network namespace of loopback only can be made for the Ray tests"
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"no `{tool}` (util-linux, iproute2): no network namespace can be made for the Ray tests"
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --net failed ({probe.stderr.strip()}): the Ray tests cannot run on loopback only"
    return None


@pytest.mark.timeout(1800)
def test_the_ray_tests_pass_in_a_network_namespace_of_loopback_only(tmp_path):
    why = _why_no_namespace()
    if why:
        pytest.skip(why)
    command = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
               sys.executable, "-m", "pytest", MODULE, "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
               "--durations=10", f"--basetemp={tmp_path / 'ray'}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1700,
                            env={**os.environ, LOOPBACK_NETNS: "1"}, cwd=os.path.dirname(os.path.dirname(MODULE)))
    print(result.stdout[-20_000:], result.stderr[-5_000:])
    assert result.returncode == 0, f"the Ray tests failed in their namespace:\n{result.stdout[-20_000:]}"
    assert " passed" in result.stdout and " failed" not in result.stdout
