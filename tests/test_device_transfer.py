"""The staged device path (one packed buffer each way, pinned on a GPU) gives exactly what
the plain path gives. On this CPU-only machine it runs without pinning; the packing,
alignment and unpacking are the same code a GPU runs."""

import numpy as np
import pytest
import torch

from fleetrl.learner.inference.device_transfer import DeviceTransfer
from fleetrl.learner.inference.env_state_store import build_state_store
from fleetrl.learner.inference.inference_step import InferenceStep, StepRequest
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.problems.registry import load_problem


def test_a_tree_of_mixed_dtypes_and_odd_sizes_comes_back_as_it_went():
    tree = {"image": torch.randint(0, 255, (3, 5, 7, 3), dtype=torch.uint8),
            "vector": torch.randn(3, 5),
            "first": torch.tensor([True, False, True]),
            "tokens": torch.randint(-9, 9, (3, 1), dtype=torch.int64),
            "state": (torch.randn(3, 1, dtype=torch.float64), torch.randn(3, 2).half()),
            "none": torch.zeros(0, 4)}
    transfer = DeviceTransfer(torch.device("cpu"), "staged")
    for _ in range(2):  # the second time reuses the host buffer
        for moved in (transfer.to_device(tree), transfer.to_host(tree)):
            assert torch.utils._pytree.tree_structure(moved) == torch.utils._pytree.tree_structure(tree)
            for a, b in zip(torch.utils._pytree.tree_leaves(moved), torch.utils._pytree.tree_leaves(tree)):
                assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_row_blocks_arrive_joined_on_both_paths_and_the_staging_buffer_is_reused():
    rng = np.random.default_rng(0)
    blocks = {"image": [rng.integers(0, 256, (n, 5, 7, 3), dtype=np.uint8) for n in (2, 1, 3)],
              "state": [rng.normal(size=(n, 3)).astype(np.float32) for n in (2, 1, 3)],
              "first": [np.array([True, False, True, False, False, True])],
              "none": [np.zeros((0, 4), np.float64)]}
    staged, plain = DeviceTransfer(torch.device("cpu"), "staged"), DeviceTransfer(torch.device("cpu"), "plain")
    buffers = []
    for _ in range(2):
        moved = staged.rows_to_device(blocks)
        buffers.append(staged._host_buffer.data_ptr())
        for name, expected in plain.rows_to_device(blocks).items():
            assert torch.equal(moved[name], expected) and moved[name].dtype == expected.dtype, name
            assert torch.equal(expected, torch.from_numpy(np.concatenate(blocks[name]))), name
    assert buffers[0] == buffers[1]


def test_an_unknown_transfer_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown inference transfer 'pinned'"):
        DeviceTransfer(torch.device("cpu"), "pinned")


def run_steps(problem_name: str, transfer: str, steps: int, num_envs: int = 4):
    """Actions and unrolls of `steps` inference steps on a fixed stream of observations."""
    torch.manual_seed(0)
    problem = load_problem(problem_name)
    agent = problem.make_agent()
    store = build_state_store(problem, agent, 3, torch.device("cpu"))
    unrolls = []
    inference = InferenceStep(problem, agent, PolicyVersion(), store, lambda u: unrolls.append(u) or True,
                              torch.device("cpu"), transfer)
    rng = np.random.default_rng(1)
    slots, run_ids = store.allocate(num_envs), np.arange(1, num_envs + 1, dtype=np.uint64)
    actions = []
    for t in range(steps):
        observation = {s.name: (rng.integers(0, 256, (num_envs, *s.shape)) if s.dtype.kind in "ui"
                                else rng.uniform(0, 1, (num_envs, *s.shape))).astype(s.dtype)
                       for s in problem.observation_specs()}
        done = rng.uniform(size=num_envs) < 0.2
        request = StepRequest(slots=slots, run_ids=run_ids, observation=observation,
                              extras={s.name: np.zeros((num_envs, *s.shape), s.dtype) for s in problem.extra_specs()},
                              reward=rng.normal(size=num_envs).astype(np.float32), terminated=done,
                              truncated=np.zeros(num_envs, bool))
        torch.manual_seed(100 + t)  # the same samples on both paths
        actions.append(inference([request])[0])
    return actions, unrolls


@pytest.mark.parametrize("problem", ["cartpole_lstm", "gym_cards/ezpoints"])
def test_the_staged_path_gives_the_plain_paths_actions_and_unrolls(problem):
    plain_actions, plain_unrolls = run_steps(problem, "plain", 9)
    staged_actions, staged_unrolls = run_steps(problem, "staged", 9)
    assert len(plain_unrolls) == len(staged_unrolls) == 4 * 2
    for a, b in zip(plain_actions, staged_actions):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    for a, b in zip(plain_unrolls, staged_unrolls):
        assert (a.slot, a.index) == (b.slot, b.index) and a.steps.keys() == b.steps.keys()
        for field in a.steps:
            assert torch.equal(a.steps[field], b.steps[field]), field
        leaves = torch.utils._pytree.tree_leaves
        assert all(torch.equal(x, y) for x, y in zip(leaves(a.initial_state), leaves(b.initial_state)))
