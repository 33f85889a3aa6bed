"""Learner ranks over torch.distributed (gloo, processes on this machine): a batch trained by
two ranks, half each, leaves the same weights as the whole batch trained by one, with the
gradients all-reduced (DDP's way) or the training sharded (FSDP)."""

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from fleetrl.learner.inference.env_state_store import build_state_store
from fleetrl.learner.inference.inference_step import InferenceStep, StepRequest
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.learner.training.data_parallel import DataParallel
from fleetrl.learner.training.sharded import ShardedAgent
from fleetrl.learner.training.trainer import Trainer
from fleetrl.losses.batch import UnrollBatch
from fleetrl.problems import load_problem

CPU = torch.device("cpu")


def cartpole_batch(problem, agent, unroll_length=5, num_envs=8) -> UnrollBatch:
    """Real unrolls of random CartPole-shaped steps through the learner's inference step."""
    assert num_envs % 2 == 0
    store = build_state_store(problem, agent, unroll_length, CPU)
    unrolls = []
    inference = InferenceStep(problem, agent, PolicyVersion(), store, lambda u: unrolls.append(u) or True, CPU)
    slots, run_ids = store.allocate(num_envs), np.arange(1, num_envs + 1, dtype=np.uint64)
    rng = np.random.default_rng(0)
    for _ in range(unroll_length + 1):
        # Both halves end as many episodes: a loss is a mean over a rank's valid steps (the
        # autoreset step is not one), as DDP's is over its own share.
        ended = np.tile(rng.uniform(size=num_envs // 2) < 0.2, 2)
        inference([StepRequest(slots=slots, run_ids=run_ids, extras={},
                               observation={"observation": rng.normal(size=(num_envs, 4)).astype(np.float32)},
                               reward=rng.normal(size=num_envs).astype(np.float32),
                               terminated=ended, truncated=np.zeros(num_envs, bool))])
    return UnrollBatch.collate(unrolls)


def numberline_vlm_batch(problem, agent) -> UnrollBatch:
    """Real unrolls of NumberLine steps, the tiny VLM generating each answer."""
    from test_vlm_agent import real_unrolls  # tests/ is on the path, here and in spawned ranks

    return real_unrolls(problem, agent)


BATCHES = {"cartpole": cartpole_batch, "gym_cards/numberline_vlm": numberline_vlm_batch}


def train(rank: int, world_size: int, hparams: dict, init_file: str | None, out: str | None,
          problem_name: str = "cartpole", fsdp: bool = False):
    """Builds the agent and the batch as every rank does (same seeds), trains this rank's share.
    Returns (and writes to `out`) the trained weights inference reads, and the optimizer state
    as a checkpoint holds it."""
    data_parallel = (DataParallel(rank, world_size, CPU, timeout_s=60, init_method=f"file://{init_file}")
                     if world_size > 1 else None)
    try:
        torch.manual_seed(0)
        problem = load_problem(problem_name, hparams)
        agent = problem.make_agent()
        batch = BATCHES[problem_name](problem, agent)
        if data_parallel:
            with torch.no_grad():  # another start on each rank, so that the broadcast must make them one
                for p in agent.parameters():
                    if p.requires_grad:
                        p.add_(rank * 0.1)
            data_parallel.broadcast_module(agent)
        share = torch.arange(batch.batch_size).chunk(world_size)[rank]
        sharded = ShardedAgent(agent, data_parallel) if fsdp else None
        if sharded:
            sharded.load_inference_weights()
            biggest = max(sharded.training.parameters(), key=lambda p: p.numel())
            assert biggest.to_local().numel() == biggest.numel() // world_size  # this rank holds half of it
        optimizer = problem.make_optimizer((sharded.training if sharded else agent).parameters())
        trainer = Trainer(problem, agent, optimizer, PolicyVersion(), CPU, data_parallel=data_parallel,
                          sharded=sharded)
        for _ in range(3):
            trainer.update(batch.select(share))
        weights = {n: p.detach().clone() for n, p in agent.named_parameters() if p.requires_grad}
        optimizer_state = sharded.optimizer_state(optimizer) if sharded else optimizer.state_dict()
        if out:
            torch.save((weights, optimizer_state), f"{out}/rank{rank}.pt")
        return weights, optimizer_state
    finally:
        if data_parallel:
            data_parallel.close()


def train_rank(rank: int, *args):
    """`train` as a spawned rank: its file written, it leaves by os._exit, as learner ranks do
    (launch.learner.exit_now): the interpreter's teardown frees FSDP's process groups while
    gloo's threads run, which aborted a rank (SIGABRT) about once in a dozen runs."""
    import os

    train(rank, *args)
    os._exit(0)


def assert_ranks_match_one(tmp_path, alone):
    """Both ranks' weights equal, and one rank's to 1e-5; rank 0's optimizer state (as its
    checkpoint would hold it) that of one rank, in the same format."""
    (weights, optimizer), (weights1, _) = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    alone_weights, alone_optimizer = alone
    for name, value in alone_weights.items():
        torch.testing.assert_close(weights[name], weights1[name], atol=0, rtol=0, msg=name)
        torch.testing.assert_close(weights[name], value, atol=1e-5, rtol=1e-5, msg=name)
    assert optimizer["param_groups"] == alone_optimizer["param_groups"]
    torch.testing.assert_close(optimizer["state"], alone_optimizer["state"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fsdp", [False, True], ids=["all-reduce", "fsdp"])
@pytest.mark.parametrize("hparams", [
    {"algorithm": "vtrace"},
    {"algorithm": "ppo", "epochs": "2", "minibatches": "1", "normalize_advantages": "false", "target_kl": "10"},
])
def test_two_ranks_with_half_the_batch_each_end_where_one_rank_with_all_of_it_does(tmp_path, hparams, fsdp):
    alone = train(0, 1, hparams, None, None)
    mp.spawn(train_rank, args=(2, hparams, str(tmp_path / "init"), str(tmp_path), "cartpole", fsdp), nprocs=2,
             join=True)
    assert_ranks_match_one(tmp_path, alone)
    weights = torch.load(tmp_path / "rank0.pt")[0]
    assert any(not torch.equal(value, weights[name]) for name, value in
               train(0, 1, {**hparams, "learning_rate": "0.01"}, None, None)[0].items())  # the comparison can fail


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True], ids=["all-reduce", "fsdp"])
def test_two_ranks_train_a_tiny_vlms_lora_adapters_as_one_rank_does(tmp_path, monkeypatch, fsdp):
    """V-trace's loss averages over every step of the batch, so halves of any batch add up.
    More than the CartPole case above proves: a model mostly frozen (LoRA adapters on a
    tiny VLM), whose frozen weights all-reduce must skip and FSDP must shard untrained."""
    pytest.importorskip("transformers", reason="the vlm extra (make install puts it in)")
    monkeypatch.setenv("FLEETRL_CACHE", str(tmp_path / "models"))  # spawned ranks inherit it: one build
    hparams = {"algorithm": "vtrace", "lora_rank": "4", "learning_rate": "1e-3"}
    load_problem("gym_cards/numberline_vlm", hparams).make_agent()  # built once, before any rank draws a number
    alone = train(0, 1, hparams, None, None, "gym_cards/numberline_vlm")
    assert any("lora_" in name for name in alone[0]) and not any(
        "lora_" not in name and ".model." in name for name in alone[0] if not name.startswith("value_head."))
    mp.spawn(train_rank, args=(2, hparams, str(tmp_path / "init"), str(tmp_path), "gym_cards/numberline_vlm", fsdp),
             nprocs=2, join=True)
    assert_ranks_match_one(tmp_path, alone)


def stall(rank: int, init_file: str, out: str):
    """Rank 1 joins the group and never reaches the first collective. Both leave by
    os._exit: a process group broken this way is left to the process's end, as the learner does."""
    import os
    import time

    data_parallel = DataParallel(rank, 2, CPU, timeout_s=3, init_method=f"file://{init_file}")
    if rank == 1:
        time.sleep(8)
        os._exit(0)
    started = time.monotonic()
    try:
        data_parallel.mean(1.0)
    except RuntimeError as e:
        with open(f"{out}/error.txt", "w") as f:
            f.write(f"{time.monotonic() - started:.1f}\n{e}")
    os._exit(0)


def test_a_rank_that_stops_answering_ends_the_others_collective_within_the_timeout(tmp_path):
    mp.spawn(stall, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    waited, message = (tmp_path / "error.txt").read_text().split("\n", 1)
    assert float(waited) < 12, waited
    assert "mean failed" in message and "collective_timeout_s=3s" in message, message


def test_fsdp_without_learner_ranks_is_refused_by_name(tmp_path):
    from fleetrl.learner.config import LearnerConfig
    from fleetrl.learner.learner import Learner

    with pytest.raises(ValueError, match="--fsdp shards the training over learner ranks"):
        Learner(LearnerConfig(problem="cartpole", logdir=str(tmp_path), bind="127.0.0.1:0", fsdp=True))


def gather_ledgers(rank: int, init_file: str, out: str, ledgers: list):
    from fleetrl.learner.accounting.metrics import EpisodeWindow
    from fleetrl.learner.training.rank_sync import RankSync

    data_parallel = DataParallel(rank, 2, CPU, timeout_s=60, init_method=f"file://{init_file}")
    try:
        merged = RankSync(2, lambda: 0, EpisodeWindow(10), 10, [], 60).gather_ledgers(ledgers[rank])
        torch.save(merged, f"{out}/ledger{rank}.pt")
    finally:
        data_parallel.close()


@pytest.mark.parametrize("ledgers", [
    [[[2**64 - 1, 5], [7, 3]], [[7, 9], [11, 1]]],  # run ids are uint64; a group on both ranks keeps its highest
    [[[2**63, 2]], []],  # a rank whose actors have sent no numbered step yet
])
def test_every_ranks_step_ledger_goes_into_the_checkpoint(tmp_path, ledgers):
    mp.spawn(gather_ledgers, args=(str(tmp_path / "init"), str(tmp_path), ledgers), nprocs=2, join=True)
    expected = {}
    for group, sequence in ledgers[0] + ledgers[1]:
        expected[group] = max(sequence, expected.get(group, 0))
    for rank in range(2):
        assert dict(map(tuple, torch.load(tmp_path / f"ledger{rank}.pt"))) == expected
