"""How often an image observation is copied between an actor's message and the batch the
trainer steps on (issue 57): once into the staging buffer (then one transfer on a GPU),
once into the state store, once out of it when its unroll completes, once into the batch.

The count is taken on the staged path, which a GPU runs; on this CPU its transfer is no copy.
"""

import os
import traceback
import tracemalloc
from collections import Counter

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fleetrl.learner.inference.env_state_store import build_state_store
from fleetrl.learner.inference.inference_step import InferenceStep, StepRequest
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.losses.batch import UnrollBatch
from fleetrl.problems.registry import load_problem

T, ENVS_PER_REQUEST, REQUESTS = 3, 2, 2
IMAGE = (64, 64, 3)  # gym_cards' observation


class ImageRowCopies(TorchDispatchMode):
    """Counts, per op, the image rows ([64, 64, 3] uint8) that ops write into new or
    existing tensors. Views write nothing and are not counted, nor is the agent's own
    reading of its input (its forward pass, under fleetrl/agents/)."""

    row_bytes = int(np.prod(IMAGE))
    writes_into = {"index_put_", "copy_"}  # in-place: the rows written are the values'

    def __init__(self):
        super().__init__()
        self.rows: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split("::")[-1]
        written = args[-1] if name in self.writes_into else out
        if isinstance(written, torch.Tensor) and written.dtype == torch.uint8 and not func.is_view:
            if written.shape[-3:] == IMAGE and not in_agent():
                self.rows[name] += written.numel() // self.row_bytes
        return out


def in_agent() -> bool:
    return any(f"{os.sep}agents{os.sep}" in frame.filename for frame in traceback.extract_stack())


def requests(problem, slots, run_ids, rng):
    """REQUESTS actors' steps of ENVS_PER_REQUEST envs each, as the server decodes them:
    read-only arrays over the message's bytes."""
    out = []
    for r in range(REQUESTS):
        rows = slice(r * ENVS_PER_REQUEST, (r + 1) * ENVS_PER_REQUEST)
        image = rng.integers(0, 256, (ENVS_PER_REQUEST, *IMAGE), dtype=np.uint8)
        image = np.frombuffer(image.tobytes(), np.uint8).reshape(image.shape)
        out.append(StepRequest(slots=slots[rows], run_ids=run_ids[rows], observation={"image": image},
                               extras={}, reward=np.zeros(ENVS_PER_REQUEST, np.float32),
                               terminated=np.zeros(ENVS_PER_REQUEST, bool),
                               truncated=np.zeros(ENVS_PER_REQUEST, bool)))
    return out


def make_inference():
    torch.manual_seed(0)
    problem = load_problem("gym_cards/ezpoints")
    agent = problem.make_agent()
    store = build_state_store(problem, agent, T, torch.device("cpu"))
    unrolls = []
    inference = InferenceStep(problem, agent, PolicyVersion(), store, lambda u: unrolls.append(u) or True,
                              torch.device("cpu"), "staged")
    envs = ENVS_PER_REQUEST * REQUESTS
    return inference, store.allocate(envs), np.arange(1, envs + 1, dtype=np.uint64), unrolls


def test_an_observation_is_copied_into_the_store_out_of_it_and_into_the_batch_once_each():
    inference, slots, run_ids, unrolls = make_inference()
    rng = np.random.default_rng(0)
    steps = 2 * T + 1  # every env completes two unrolls: steps 0..3 and 3..6
    copies = ImageRowCopies()
    with copies:
        for _ in range(steps):
            inference(requests(inference.problem, slots, run_ids, rng))
        batch = UnrollBatch.collate(unrolls)
    envs, emitted = len(slots), len(unrolls)
    assert emitted == 2 * envs and batch.observation["image"].shape == (T + 1, emitted, *IMAGE)
    assert copies.rows == {
        "index_put_": steps * envs  # each step's rows, into the store
                      + emitted,  # the overlap: each unroll's last step becomes the next one's first
        "index": emitted * (T + 1)  # a completed unroll's steps, out of the store
                 + emitted,  # the overlap's read
        "stack": emitted * (T + 1),  # the unrolls, into the batch
    }, "no other copy of an observation (a clone, a concatenation, a conversion) on the way"


def test_a_batch_is_written_from_the_messages_into_the_staging_buffer_directly():
    """No host array of the joined batch is made on the way: the requests' rows go straight
    into the staging buffer (numpy reports its allocations to tracemalloc; torch's do not
    show there, and the staging buffer is kept across steps)."""
    inference, slots, run_ids, _ = make_inference()
    rng = np.random.default_rng(0)
    inference(requests(inference.problem, slots, run_ids, rng))  # the staging buffer is made
    batch_bytes = len(slots) * int(np.prod(IMAGE))
    step = requests(inference.problem, slots, run_ids, rng)
    tracemalloc.start()
    try:
        inference(step)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < batch_bytes / 2, f"{peak} bytes of numpy arrays for a batch of {batch_bytes} image bytes"
