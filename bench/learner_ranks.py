"""Data-parallel learner ranks: trainer samples/s with 1 and N ranks, side by side, and the
gradient all-reduce's cost per update.

    python -m fleetrl.bench.learner_ranks --problem=cartpole --ranks=1,2

Each rank trains its share (B / ranks unrolls) of the same total batch of B unrolls, as
learner ranks do, on gloo over loopback (processes on this machine, one torch thread each).
Samples are transitions of the whole batch: T x B per update. --slow_rank_delay_ms holds
the last rank back before each update, to show what a slow rank costs the others. On a machine with fewer
cores than ranks x 2 the figures say what the all-reduce costs, not how far ranks scale.
--fsdp trains sharded (`fleetrl.learner.training.sharded`) instead, and times the all-gather that
refreshes inference's whole copy after each optimizer step.
"""

from __future__ import annotations

import os
import tempfile
import time

import torch
import torch.multiprocessing as mp
from absl import app, flags

from fleetrl.bench.trainer import synthetic_batches
from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.learner.training.data_parallel import DataParallel
from fleetrl.learner.training.sharded import ShardedAgent
from fleetrl.learner.training.trainer import Trainer
from fleetrl.problems.registry import load_problem

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Here, not at import: other benches define flags of the same names."""
    flags.DEFINE_string("problem", "cartpole", "Problem whose agent and loss are trained.")
    flags.DEFINE_list("hparams", [], "name=value overrides of the Problem's config.")
    flags.DEFINE_list("ranks", ["1", "2"], "World sizes to measure, one after the other.")
    flags.DEFINE_integer("unroll_length", 20, "T.")
    flags.DEFINE_integer("batch_size", 32, "B, the whole batch over every rank.")
    flags.DEFINE_float("measure_s", 10.0, "Seconds measured per world size.")
    flags.DEFINE_float("slow_rank_delay_ms", 0.0, "The last rank waits this long before each update, as a rank "
                                                 "whose actors deliver late: every rank then waits for it.")
    flags.DEFINE_bool("fsdp", False, "Ranks train with FSDP; the figure per step is then the inference copy's "
                                     "refresh (an all-gather), not the all-reduce.")


def measure(rank: int, world_size: int, problem_name: str, hparams: dict, unroll_length: int, batch_size: int,
            measure_s: float, delay_ms: float, init_file: str, results: str, fsdp: bool = False) -> None:
    torch.set_num_threads(1)
    data_parallel = (DataParallel(rank, world_size, torch.device("cpu"), init_method=f"file://{init_file}")
                     if world_size > 1 else None)
    problem = load_problem(problem_name, hparams)
    torch.manual_seed(0)
    agent = problem.make_agent()
    sharded = ShardedAgent(agent, data_parallel) if fsdp and data_parallel is not None else None
    trained = sharded.training if sharded else agent
    trainer = Trainer(problem, agent, problem.make_optimizer(trained.parameters()), PolicyVersion(),
                      torch.device("cpu"), data_parallel=data_parallel, sharded=sharded)
    batches = synthetic_batches(problem, agent, unroll_length, batch_size // world_size)
    reduce_s = [0.0]
    if data_parallel is not None:  # the all-reduce's (or FSDP's refresh's) own time, inside each optimizer step
        owner, name = (sharded, "publish") if sharded else (data_parallel, "average_gradients")
        collective = getattr(owner, name)

        def timed(*args):
            started = time.perf_counter()
            collective(*args)
            reduce_s[0] += time.perf_counter() - started
        setattr(owner, name, timed)
    for batch in batches[:2]:  # warm-up
        trainer.update(batch)
    reduce_s[0], steps_before = 0.0, trainer.policy.version
    updates, start = 0, time.perf_counter()
    # A fixed count on every rank (rank 0's time decides it), so that the collectives pair up.
    while True:
        if world_size > 1 and rank == world_size - 1 and delay_ms:
            time.sleep(delay_ms / 1000)
        trainer.update(batches[updates % len(batches)])
        updates += 1
        done = torch.tensor([float(time.perf_counter() - start >= measure_s)])
        if data_parallel is not None:
            torch.distributed.broadcast(done, src=0)
        if done.item():
            break
    elapsed = time.perf_counter() - start
    steps = trainer.policy.version - steps_before
    if rank == 0:
        with open(results, "w") as f:
            f.write(f"{updates * unroll_length * batch_size / elapsed} {1000 * elapsed / updates} "
                    f"{1000 * reduce_s[0] / max(steps, 1)}")
    if data_parallel is not None:
        data_parallel.close()


def main(argv: list[str]) -> None:
    del argv
    hparams = dict(h.split("=", 1) for h in FLAGS.hparams)
    print(f"fleetrl learner ranks: {FLAGS.problem}, T={FLAGS.unroll_length}, B={FLAGS.batch_size} over all ranks, "
          f"{os.cpu_count()} CPUs, gloo", flush=True)
    for world_size in (int(r) for r in FLAGS.ranks):
        with tempfile.TemporaryDirectory() as folder:
            args = (world_size, FLAGS.problem, hparams, FLAGS.unroll_length, FLAGS.batch_size, FLAGS.measure_s,
                    FLAGS.slow_rank_delay_ms, os.path.join(folder, "init"), os.path.join(folder, "results"), FLAGS.fsdp)
            mp.spawn(measure, args=args, nprocs=world_size, join=True)
            samples, update_ms, reduce_ms = (float(x) for x in open(args[-2]).read().split())
        what = "FSDP, inference copy's refresh" if FLAGS.fsdp else "all-reduce"
        reduce = f", {what} {reduce_ms:.2f} ms per optimizer step" if world_size > 1 else ""
        print(f"  {world_size} rank(s): {samples:10,.0f} samples/s ({update_ms:.2f} ms per update{reduce})", flush=True)


if __name__ == "__main__":
    define_flags()
    app.run(main)
