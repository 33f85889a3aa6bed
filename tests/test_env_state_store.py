"""Learner-side env state: overlapping unrolls, recurrent state at unroll starts, run ids."""

import numpy as np
import torch

from fleetrl.learner.inference.env_state_store import EnvStateStore

T = 3  # unroll length: unrolls hold T+1 steps


def make_store(capacity=2):
    fields = {"obs/x": (torch.float32, ()), "action/action": (torch.int64, ())}
    return EnvStateStore(T, fields, {"action": (torch.int64, ())}, (torch.zeros(1, 2),), capacity=capacity)


def feed(store, slots, run_ids, values, ended=None):
    """One step for `slots`; the state after it is the step's value, to trace it later."""
    slots, run_ids = np.asarray(slots), np.asarray(run_ids, np.uint64)
    first, state, prev_action = store.lookup(slots, run_ids)
    values = torch.tensor(values, dtype=torch.float32)
    step = {"obs/x": values, "action/action": values.long()}
    after = (values[:, None].repeat(1, 2),)
    ended = np.zeros(len(slots), bool) if ended is None else np.asarray(ended)
    unrolls = store.end_step(slots, run_ids, step, state, after, {"action": values.long()}, ended)
    return first, state, prev_action, unrolls


def test_unrolls_overlap_by_one_step_and_carry_their_starting_state():
    store = make_store()
    slots = store.allocate(1)
    emitted = []
    for value in range(1, 11):
        emitted += feed(store, slots, [7], [value])[3]
    # Steps 1..10 give unrolls [1,2,3,4], [4,5,6,7], [7,8,9,10].
    assert [u.steps["obs/x"].tolist() for u in emitted] == [[1, 2, 3, 4], [4, 5, 6, 7], [7, 8, 9, 10]]
    assert [(u.slot, u.run_id, u.index) for u in emitted] == [(slots[0], 7, 0), (slots[0], 7, 1), (slots[0], 7, 2)]
    # The state before step 4 is the state after step 3.
    assert emitted[1].initial_state[0].tolist() == [[3.0, 3.0]]
    assert emitted[2].initial_state[0].tolist() == [[6.0, 6.0]]


def test_first_flags_and_previous_action():
    store = make_store()
    slots = store.allocate(2)
    first, _, prev, _ = feed(store, slots, [1, 2], [5, 6])
    assert first.tolist() == [True, True] and prev["action"].tolist() == [0, 0]
    first, state, prev, _ = feed(store, slots, [1, 2], [7, 8], ended=[True, False])
    assert first.tolist() == [False, False] and prev["action"].tolist() == [5, 6]
    assert state[0].tolist() == [[5, 5], [6, 6]]
    first, _, prev, _ = feed(store, slots, [1, 2], [9, 9])
    # Env 0 ended: the next step starts an episode, with no previous action.
    assert first.tolist() == [True, False] and prev["action"].tolist() == [0, 8]


def test_a_new_run_id_drops_the_partial_unroll():
    store = make_store()
    slots = store.allocate(1)
    feed(store, slots, [1], [1])
    feed(store, slots, [1], [2])
    first, _, _, _ = feed(store, slots, [99], [3])  # the actor restarted
    assert first.tolist() == [True]
    assert store.dropped_partial_unrolls == 1
    unrolls = []
    for value in (4, 5, 6):
        unrolls += feed(store, slots, [99], [value])[3]
    assert [u.steps["obs/x"].tolist() for u in unrolls] == [[3, 4, 5, 6]]
    assert [(u.run_id, u.index) for u in unrolls] == [(99, 0)]  # the new run's first unroll


def test_slots_are_reused_fresh_and_capacity_grows():
    store = make_store(capacity=2)
    a = store.allocate(2)
    feed(store, a, [1, 2], [1, 1])
    store.release(a)
    b = store.allocate(3)  # more than the initial capacity
    assert len(set(b.tolist())) == 3 and store.num_allocated() == 3
    first, _, _, _ = feed(store, b, [1, 2, 3], [1, 1, 1])
    assert first.tolist() == [True, True, True]


def test_looking_up_changes_nothing_until_the_step_ends():
    """A failed forward pass between lookup and end_step must leave the store as it was,
    so that the step can be retried: the first flags come out the same."""
    store = make_store()
    slots = store.allocate(2)
    run_ids = np.array([1, 2], np.uint64)
    first_try, _, _ = store.lookup(slots, run_ids)
    again, _, _ = store.lookup(slots, run_ids)
    assert first_try.tolist() == again.tolist() == [True, True]
    feed(store, slots, [1, 2], [5, 6])
    assert store.lookup(slots, run_ids)[0].tolist() == [False, False]


def test_reserving_grows_the_store_without_taking_slots_so_that_allocating_does_not():
    """The server reserves off its event loop; allocating on the loop then copies nothing."""
    store = make_store(capacity=2)
    store.allocate(1)
    store.reserve(5)
    assert store.free_slots() >= 5 and store.num_allocated() == 1
    buffers = {k: v.data_ptr() for k, v in store._buffers.items()}
    slots = store.allocate(5)
    assert len(slots) == 5 and {k: v.data_ptr() for k, v in store._buffers.items()} == buffers
