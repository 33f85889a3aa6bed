"""Renders robosuite's cameras only for the observations that leave the env.

robosuite renders every camera at every action, and a LIBERO step on a CPU host is about
four fifths rendering (docs/libero.md). With chunks of K actions only the chunk's last
observation leaves the env, and a reset's wait steps hand out only their last one.

`CameraGate` wraps each camera's sensor (not the observable: a disabled observable hands
back stale images) so that, while the gate is closed, the sensor renders nothing. It keeps
a copy of the simulator's data instead (about a millisecond), taken at the very substep
where robosuite would have rendered, with the model's colours (LIBERO's `_post_process`
toggles a site's alpha after the step, a lit stove's flame for one), so that a step whose outcome ends the episode (a
success, known only after the step) can still hand out the final frame robosuite would
have rendered: `render_closed_step` renders it from that copy. The images that leave the
env are therefore the ones robosuite renders with every camera always on, bit for bit.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # mujoco comes with the libero extra; this module imports without it
    import mujoco


class CameraGate:
    def __init__(self, robosuite_env: Any):
        """Wraps the RGB sensors of `robosuite_env.camera_names`; the gate starts open."""
        if any(robosuite_env.camera_depths) or robosuite_env.camera_segmentations is not None and \
                any(s is not None for s in robosuite_env.camera_segmentations):
            raise ValueError("CameraGate gates RGB cameras only; this env also renders depth or segmentation")
        self.open = False  # robosuite calls a sensor once when it is set: closed, that renders nothing
        self._env = robosuite_env
        self._snapshot: mujoco.MjData | None = None
        self._snapshot_colours: dict[str, np.ndarray] = {}
        self._snapshot_time = -1.0
        self._sensors: dict[str, Callable[[dict], np.ndarray]] = {}
        for camera, height, width in zip(robosuite_env.camera_names, robosuite_env.camera_heights,
                                         robosuite_env.camera_widths):
            name = f"{camera}_image"
            self._sensors[name] = robosuite_env._observables[name]._sensor
            placeholder = np.zeros((height, width, 3), np.uint8)  # what robosuite's RGB sensor returns
            robosuite_env.modify_observable(name, "sensor", self._gated(self._sensors[name], placeholder))
        self.set(True)

    def set(self, open_: bool) -> None:
        """Opens or closes the gate for what runs next (a step, a reset's settling)."""
        self.open, self._snapshot = open_, None

    def _gated(self, render: Callable[[dict], np.ndarray], placeholder: np.ndarray) -> Callable[[dict], np.ndarray]:
        def sensor(obs_cache: dict) -> np.ndarray:
            if self.open:
                self._make_current()
                return render(obs_cache)
            data = self._env.sim.data._data
            if self._snapshot is None or self._snapshot_time != data.time:  # the cameras sample at one substep
                self._snapshot, self._snapshot_time = copy.copy(data), data.time
                model = self._env.sim.model._model
                self._snapshot_colours = {name: getattr(model, name).copy() for name in _COLOURS}
            return placeholder

        sensor.__modality__ = render.__modality__  # robosuite's @sensor marks it
        return sensor

    def _make_current(self) -> None:
        make_current(self._env)

    def render_closed_step(self) -> dict[str, np.ndarray]:
        """Each camera's image as robosuite would have rendered it in the last step, which ran
        with the gate closed: rendered from the simulator's data as it was then."""
        if self._snapshot is None:
            raise RuntimeError("no step has run with the camera gate closed")
        context = self._env.sim._render_context_offscreen
        model = self._env.sim.model._model
        live_data = context.data
        live_colours = {name: getattr(model, name).copy() for name in _COLOURS}
        context.data = _DataView(self._snapshot)
        self._make_current()
        for name, colours in self._snapshot_colours.items():
            getattr(model, name)[:] = colours
        try:
            return {name: np.asarray(render({})) for name, render in self._sensors.items()}
        finally:
            context.data = live_data
            for name, colours in live_colours.items():
                getattr(model, name)[:] = colours


# The model's arrays that LIBERO changes between steps and a render reads.
_COLOURS = ("site_rgba", "geom_rgba", "mat_rgba")


class _DataView:
    """What robosuite's render context reads of its MjData wrapper: the raw `_data`."""

    def __init__(self, data: mujoco.MjData):
        self._data = data


def make_current(robosuite_env: Any) -> None:
    """Makes the env's GL context the current one. robosuite assumes it is when it renders and
    when it frees a render context (a close, a hard reset), but another env's build in this
    process makes its own current: rendering into it, or freeing there, spoils both envs."""
    context = robosuite_env.sim._render_context_offscreen
    if context is not None:
        context.gl_ctx.make_current()


def set_msaa(robosuite_env: Any, samples: int) -> None:
    """Sets the offscreen multisampling (MuJoCo's default, 4, smooths edges and costs about 40%
    of a render on a CPU host; 0 turns it off). The render context must be made afresh."""
    robosuite_env.sim.model._model.vis.quality.offsamples = samples


def renew_render_context(robosuite_env: Any) -> None:
    """Makes the offscreen render context again, from the model as it is now (its
    multisampling, its meshes): the context holds copies of both."""
    import mujoco

    sim = robosuite_env.sim
    context = sim._render_context_offscreen
    if context is None:
        return
    context.gl_ctx.make_current()
    context.con.free()
    context.con = mujoco.MjrContext(sim.model._model, mujoco.mjtFontScale.mjFONTSCALE_150)
    mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, context.con)
