"""LIBERO's own configuration, written by fleetrl so that importing libero never prompts.

`import libero` asks on stdin where its files are unless `$LIBERO_CONFIG_PATH/config.yaml`
exists (an EOFError in CI). `prepare_libero` writes that file from the installed package's
location, without importing it, and defaults MuJoCo to headless EGL rendering.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os

from fleetrl.common.extras import MissingExtra
from fleetrl.common.files import atomic_write_text

DEFAULT_CONFIG_DIR = os.path.join(os.path.expanduser("~"), ".fleetrl", "libero")
# LIBERO's init states are placements that the settling steps drop, and MuJoCo 3.4 changed a
# box-box contact and with it where LIBERO-Spatial task 5's bowl lands (docs/libero.md).
SETTLES_AS_RECORDED_BELOW = (3, 4)

log = logging.getLogger(__name__)


class LiberoNotInstalled(MissingExtra):
    def __init__(self):
        super().__init__("LIBERO", "libero", how="pip install 'fleetrl[libero]', then pip install --no-deps "
                                                  "libero==0.1.1 and link its assets (`make libero` does all three; "
                                                  "see docs/libero.md)")


def prepare_libero(config_dir: str | None = None, mujoco_gl: str = "egl") -> str:
    """Writes config.yaml (if missing) and sets LIBERO_CONFIG_PATH and MUJOCO_GL unless the
    environment already sets them; returns the config file's path. Call before importing libero."""
    spec = importlib.util.find_spec("libero")
    # The package holds libero/libero/; a mere folder named libero (a namespace package) does not.
    roots = [os.path.join(p, "libero") for p in (spec.submodule_search_locations or []) if spec] if spec else []
    root = next((r for r in roots if os.path.isdir(os.path.join(r, "bddl_files"))), None)
    if root is None:
        raise LiberoNotInstalled()
    config_dir = os.environ.setdefault("LIBERO_CONFIG_PATH", config_dir or DEFAULT_CONFIG_DIR)
    os.environ.setdefault("MUJOCO_GL", mujoco_gl)
    # robosuite's logger prints its own lines; passed on to the root logger too (absl's, at
    # the entry points), each of its warnings printed twice.
    logging.getLogger("robosuite_logs").propagate = False
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
    path = os.path.join(config_dir, "config.yaml")
    if not os.path.exists(path) or (config_dir == DEFAULT_CONFIG_DIR and not _points_at(path, root)):
        # fleetrl's own file follows the install in use (another venv may have written it);
        # a config the user placed elsewhere is never overwritten.
        os.makedirs(config_dir, exist_ok=True)
        entries = {"benchmark_root": root, "bddl_files": os.path.join(root, "bddl_files"),
                   "init_states": os.path.join(root, "init_files"), "datasets": os.path.join(config_dir, "datasets"),
                   "assets": os.path.join(root, "assets")}
        atomic_write_text(path, "".join(f"{key}: {value}\n" for key, value in entries.items()))
    try:
        warning = mujoco_settling_warning(importlib.metadata.version("mujoco"))
    except importlib.metadata.PackageNotFoundError:  # libero's own import then says what is missing
        warning = None
    if warning:
        log.warning(warning)
    return path


def mujoco_settling_warning(version: str) -> str | None:
    """A warning for a MuJoCo whose settling differs from the one LIBERO's scores were made
    with; None for one that settles as recorded."""
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return f"cannot read MuJoCo's version {version!r}; LIBERO's init states settle as recorded only below 3.4"
    if major_minor < SETTLES_AS_RECORDED_BELOW:
        return None
    return (f"MuJoCo {version} settles LIBERO's init states differently from the versions below 3.4 that "
            "published LIBERO scores used (libero_spatial task 5's bowl lands off its ramekin); install "
            "mujoco==3.3.7 as fleetrl's libero extra pins it, see docs/libero.md")


def _points_at(path: str, root: str) -> bool:
    with open(path) as f:
        return f"benchmark_root: {root}\n" in f.read()
