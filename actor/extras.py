"""Per-step extras, read from the envs' step infos (see `Problem.extra_specs`).

A feature that trains with a per-step field (action chunks' per-action rewards, a
teacher-forcing draw, one of a user's own) has its env or wrapper put the field in the
step's info under its name; the Problem declares its spec. Actors read it from there and
send it with the step. A step whose info lacks it (a reset, usually) sends zeros.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fleetrl.proto.tensors import Specs, TensorSpec


def vector_extras(info: Mapping[str, Any], specs: Specs, num_envs: int) -> dict[str, np.ndarray]:
    """The extras of a vector step from Gymnasium's vector info, which masks each key's
    entries with "_key" (the envs whose info set it)."""
    out = {}
    for spec in specs:
        array = np.zeros((num_envs, *spec.shape), spec.dtype)
        if spec.name in info:
            value = _checked(spec, np.asarray(info[spec.name]), (num_envs, *spec.shape))
            mask = np.asarray(info.get(f"_{spec.name}", np.ones(num_envs, bool)), bool)
            array[mask] = value[mask]
        out[spec.name] = array
    return out


def env_extras(info: Mapping[str, Any], specs: Specs) -> dict[str, np.ndarray]:
    """The extras of one env's step from its own info."""
    return {spec.name: (_checked(spec, np.asarray(info[spec.name]), spec.shape) if spec.name in info
                        else np.zeros(spec.shape, spec.dtype)) for spec in specs}


def _checked(spec: TensorSpec, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if value.shape != shape:
        raise ValueError(f"the env's info[{spec.name!r}] has shape {list(value.shape)} where the Problem's extra "
                         f"spec needs {list(shape)}")
    return value.astype(spec.dtype, copy=False)
