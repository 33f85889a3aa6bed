"""Named tensors on the wire: specs, encoding, and validation against a spec.

A tensor travels as (name, dtype, shape, raw little-endian bytes). Decoding checks every
field before touching the bytes, so a malformed message yields a `WireError` naming the
field instead of a crash or a silently reshaped array. Nothing here unpickles anything.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import gymnasium as gym
import numpy as np

from fleetrl.proto import learner_pb2 as pb


class WireError(ValueError):
    """A message that does not match the protocol or the handshake's specs."""


_DTYPES: dict[int, np.dtype] = {
    pb.FLOAT32: np.dtype("<f4"),
    pb.FLOAT64: np.dtype("<f8"),
    pb.FLOAT16: np.dtype("<f2"),
    pb.INT8: np.dtype("i1"),
    pb.INT16: np.dtype("<i2"),
    pb.INT32: np.dtype("<i4"),
    pb.INT64: np.dtype("<i8"),
    pb.UINT8: np.dtype("u1"),
    pb.BOOL: np.dtype("?"),
}
_WIRE_DTYPES = {dtype.newbyteorder("="): wire for wire, dtype in _DTYPES.items()}


def wire_dtype(dtype: np.dtype | type) -> int:
    """The protocol's DType enum for a numpy dtype."""
    key = np.dtype(dtype).newbyteorder("=")
    if key not in _WIRE_DTYPES:
        raise WireError(f"dtype {np.dtype(dtype)} cannot be sent; supported: {sorted(str(d) for d in _WIRE_DTYPES)}")
    return _WIRE_DTYPES[key]


def dtype_name(wire: int) -> str:
    return pb.DType.Name(wire) if wire in pb.DType.values() else f"unknown({wire})"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """The name, dtype and per-env shape of one observation, action or extra tensor.

    `low` and `high`, when set, bound every value: the learner refuses a message with a
    value outside them (say, more actions executed than a chunk holds). They stay on the
    learner's side; the wire carries name, dtype and shape.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    low: float | None = None
    high: float | None = None

    def to_proto(self) -> pb.TensorSpec:
        return pb.TensorSpec(name=self.name, dtype=wire_dtype(self.dtype), shape=list(self.shape))

    @staticmethod
    def from_proto(msg: pb.TensorSpec) -> TensorSpec:
        if msg.dtype not in _DTYPES:
            raise WireError(f"spec {msg.name!r} has unknown dtype {dtype_name(msg.dtype)}")
        return TensorSpec(msg.name, _DTYPES[msg.dtype].newbyteorder("="), tuple(msg.shape))

    def describe(self) -> str:
        return f"{self.name!r} {self.dtype} {list(self.shape)}"


Specs = tuple[TensorSpec, ...]


def specs_from_space(space: gym.Space, default_name: str) -> Specs:
    """Specs for a Gymnasium space: a Dict space gives one spec per key, any other one spec."""
    if isinstance(space, gym.spaces.Dict):
        return tuple(spec for key, sub in space.spaces.items() for spec in specs_from_space(sub, key))
    if isinstance(space, gym.spaces.Discrete):
        return (TensorSpec(default_name, np.dtype(np.int64), ()),)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return (TensorSpec(default_name, np.dtype(np.int64), tuple(space.shape)),)
    if isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary)):
        return (TensorSpec(default_name, np.dtype(space.dtype), tuple(space.shape)),)
    raise TypeError(f"space {space} has no tensor spec; use Box, Discrete, MultiDiscrete, MultiBinary or a Dict "
                    "of them")


def spec_mismatch(kind: str, expected: Specs, got: Specs) -> str | None:
    """A sentence naming the first difference between two spec lists, or None if equal."""
    expected_by_name = {s.name: s for s in expected}
    got_by_name = {s.name: s for s in got}
    for name in expected_by_name.keys() - got_by_name.keys():
        return f"the learner expects {kind} {name!r}, which the actor does not send"
    for name in got_by_name.keys() - expected_by_name.keys():
        return f"the actor sends {kind} {name!r}, which the learner does not expect"
    for name, want in expected_by_name.items():
        have = got_by_name[name]
        if have.shape != want.shape:
            return f"the {kind} {name!r} has shape {list(have.shape)} where the learner expects {list(want.shape)}"
        if have.dtype != want.dtype:
            return f"the {kind} {name!r} has dtype {have.dtype} where the learner expects {want.dtype}"
    return None


def encode(name: str, array: np.ndarray) -> pb.Tensor:
    array = np.asarray(array)
    wire = wire_dtype(array.dtype)
    data = np.ascontiguousarray(array, dtype=_DTYPES[wire]).tobytes()
    return pb.Tensor(name=name, dtype=wire, shape=list(array.shape), data=data)


def encode_all(arrays: Mapping[str, np.ndarray]) -> list[pb.Tensor]:
    return [encode(name, array) for name, array in arrays.items()]


def decode(msg: pb.Tensor, spec: TensorSpec | None = None, batch: int | None = None,
           field: str = "tensor") -> np.ndarray:
    """Decodes one tensor, checking it against `spec` (per-env shape) and `batch` (first dim)."""
    where = f"{field} {msg.name!r}"
    if msg.dtype not in _DTYPES:
        raise WireError(f"{where}: unknown dtype {dtype_name(msg.dtype)}")
    dtype = _DTYPES[msg.dtype]
    shape = tuple(msg.shape)
    if any(d < 0 for d in shape):
        raise WireError(f"{where}: negative dimension in shape {list(shape)}")
    if spec is not None:
        if dtype.newbyteorder("=") != spec.dtype:
            raise WireError(f"{where}: dtype {dtype_name(msg.dtype)} differs from the handshake spec {spec.dtype}")
        if shape[1:] != spec.shape or len(shape) != len(spec.shape) + 1:
            raise WireError(f"{where}: shape {list(shape)} differs from the handshake spec [num_envs] + "
                            f"{list(spec.shape)}")
    if batch is not None and (not shape or shape[0] != batch):
        raise WireError(f"{where}: first dimension of {list(shape)} should be the {batch} envs in the message")
    expected_bytes = math.prod(shape) * dtype.itemsize  # not np.prod: this runs per tensor per message
    if len(msg.data) != expected_bytes:
        raise WireError(f"{where}: {len(msg.data)} bytes of data where shape {list(shape)} of {dtype} needs "
                        f"{expected_bytes}")
    return np.frombuffer(msg.data, dtype=dtype).reshape(shape)


def decode_all(msgs: Sequence[pb.Tensor], specs: Specs, batch: int, field: str,
               env_indices: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Decodes exactly the tensors named by `specs`; a missing, extra or repeated name is an
    error, and so is a NaN or infinity in a float tensor (named by its env, `env_indices[row]`)."""
    by_name = {spec.name: spec for spec in specs}
    out: dict[str, np.ndarray] = {}
    for msg in msgs:
        if msg.name not in by_name:
            raise WireError(f"{field} {msg.name!r} is not in the handshake spec (expected {sorted(by_name)})")
        if msg.name in out:
            raise WireError(f"{field} {msg.name!r} appears twice")
        spec = by_name[msg.name]
        array = decode(msg, spec, batch, field)
        rows = array.reshape(len(array), -1)

        def env(row: int) -> int:
            return int(env_indices[row]) if env_indices is not None else row

        if array.dtype.kind == "f" and not np.isfinite(rows).all():
            row = int(np.flatnonzero(~np.isfinite(rows).all(axis=1))[0])
            raise WireError(f"{field} {msg.name!r}: env {env(row)} has a NaN or infinite value")
        if spec.low is None and spec.high is None:
            out[msg.name] = array
            continue
        outside = np.zeros(rows.shape, bool)
        if spec.low is not None:
            outside |= rows < spec.low
        if spec.high is not None:
            outside |= rows > spec.high
        if outside.any():
            row = int(np.flatnonzero(outside.any(axis=1))[0])
            raise WireError(f"{field} {msg.name!r}: env {env(row)} has {rows[row][outside[row]][0]}, outside "
                            f"[{spec.low}, {spec.high}]")
        out[msg.name] = array
    missing = by_name.keys() - out.keys()
    if missing:
        raise WireError(f"{field} {sorted(missing)} missing from the message")
    return out
