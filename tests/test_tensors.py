"""Tensors and specs on the wire: round trips, and errors that name the field."""

import gymnasium as gym
import numpy as np
import pytest

from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto.tensors import TensorSpec, WireError, decode, decode_all, encode, spec_mismatch, specs_from_space


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "bool"])
def test_round_trip(dtype):
    array = (np.arange(24).reshape(2, 3, 4) % 3).astype(dtype)
    decoded = decode(encode("x", array), TensorSpec("x", np.dtype(dtype), (3, 4)), batch=2)
    assert decoded.dtype == np.dtype(dtype) and np.array_equal(decoded, array)


def test_messages_are_plain_protobuf_bytes():
    message = pb.Tensor.FromString(encode("obs", np.ones((2, 4), np.float32)).SerializeToString())
    assert message.dtype == pb.FLOAT32 and list(message.shape) == [2, 4] and len(message.data) == 32


SPEC = TensorSpec("image", np.dtype(np.uint8), (8, 8, 3))


@pytest.mark.parametrize("tensor,error", [
    (encode("image", np.zeros((2, 8, 8, 3), np.float32)), "dtype FLOAT32 differs"),
    (encode("image", np.zeros((2, 8, 8, 4), np.uint8)), "shape [2, 8, 8, 4] differs"),
    (encode("image", np.zeros((3, 8, 8, 3), np.uint8)), "should be the 2 envs"),
    (pb.Tensor(name="image", dtype=pb.UINT8, shape=[2, 8, 8, 3], data=b"\x00" * 100), "100 bytes"),
    (pb.Tensor(name="image", dtype=42, shape=[2, 8, 8, 3]), "unknown dtype"),
    (pb.Tensor(name="image", dtype=pb.UINT8, shape=[2, -8, 8, 3]), "negative dimension"),
])
def test_decode_rejects_with_the_field_named(tensor, error):
    with pytest.raises(WireError, match="'image'") as info:
        decode(tensor, SPEC, batch=2, field="observation")
    assert error in str(info.value)


def test_decode_all_requires_exactly_the_spec_names():
    specs = (SPEC, TensorSpec("state", np.dtype(np.float32), (8,)))
    image = encode("image", np.zeros((1, 8, 8, 3), np.uint8))
    with pytest.raises(WireError, match=r"\['state'\] missing"):
        decode_all([image], specs, 1, "observation")
    with pytest.raises(WireError, match="'extra' is not in the handshake spec"):
        decode_all([image, encode("extra", np.zeros((1,)))], specs, 1, "observation")
    with pytest.raises(WireError, match="appears twice"):
        decode_all([image, image], specs, 1, "observation")


def test_specs_from_spaces():
    space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
                             "tokens": gym.spaces.MultiDiscrete([10] * 5)})
    assert specs_from_space(space, "observation") == (
        TensorSpec("image", np.dtype(np.uint8), (8, 8, 3)), TensorSpec("tokens", np.dtype(np.int64), (5,)))
    assert specs_from_space(gym.spaces.Discrete(4), "action") == (TensorSpec("action", np.dtype(np.int64), ()),)


def test_spec_mismatch_names_the_difference():
    want = (SPEC,)
    assert spec_mismatch("observation", want, want) is None
    got = (TensorSpec("image", np.dtype(np.uint8), (4, 4, 3)),)
    assert spec_mismatch("observation", want, got) == \
        "the observation 'image' has shape [4, 4, 3] where the learner expects [8, 8, 3]"
    assert "does not send" in spec_mismatch("observation", want, ())
