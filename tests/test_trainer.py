"""The trainer: epochs of minibatches per batch, whole unrolls per minibatch, and blocking inference."""

import threading

import pytest
import torch

from fleetrl.learner.policy_version import PolicyVersion
from fleetrl.learner.training.trainer import Trainer
from fleetrl.losses.ppo import categorical_kl
from fleetrl.problems import load_problem


def test_ppo_takes_epochs_times_minibatches_steps_over_whole_unrolls(unroll_batch):
    problem = load_problem("cartpole", {"algorithm": "ppo", "epochs": "3", "minibatches": "4"})
    agent = problem.make_agent()
    batch = unroll_batch(problem, agent)
    seen = []
    algorithm = problem.algorithm()
    original = algorithm.loss

    def spy(problem_, agent_, minibatch, prepared):
        seen.append((minibatch.batch_size, minibatch.first.shape[0], prepared["advantages"].shape))
        return original(problem_, agent_, minibatch, prepared)

    algorithm.loss = spy
    try:
        trainer = Trainer(problem, agent, problem.make_optimizer(agent.parameters()), PolicyVersion(),
                          torch.device("cpu"))
        before = [p.detach().clone() for p in agent.parameters()]
        logs = trainer.update(batch)
    finally:
        del algorithm.loss
    assert trainer.policy.version == 12  # one version per optimizer step
    assert seen == [(2, 6, (5, 2))] * 12  # 8 unrolls of T + 1 = 6 steps, in minibatches of 2
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.parameters()))
    assert {"ppo/approx_kl", "ppo/clip_fraction", "value/explained_variance", "loss/value"} <= set(logs)


def test_target_kl_stops_a_batch_before_the_step_that_would_go_past_it(unroll_batch):
    """The KL is checked before each step, as SB3 does: the step whose minibatch is already
    past 1.5 x target_kl is not taken, and neither are the batch's later ones."""
    problem = load_problem("cartpole", {"algorithm": "ppo", "epochs": "4", "minibatches": "2", "learning_rate": "0.05",
                                        "target_kl": "0.001"})
    agent = problem.make_agent()
    batch = unroll_batch(problem, agent)
    trainer = Trainer(problem, agent, problem.make_optimizer(agent.parameters()), PolicyVersion(),
                      torch.device("cpu"))
    logs = trainer.update(batch)
    # The first step starts at KL 0 (the batch's own policy); a step at this rate overshoots.
    assert 1 <= trainer.policy.version < 8 and logs["ppo/stopped_early"] == 1.0
    unlimited = load_problem("cartpole", {"algorithm": "ppo", "epochs": "4", "minibatches": "2",
                                          "learning_rate": "0.05"})
    trainer = Trainer(unlimited, agent, unlimited.make_optimizer(agent.parameters()), PolicyVersion(),
                      torch.device("cpu"))
    assert "ppo/stopped_early" not in trainer.update(batch) and trainer.policy.version == 8


def test_blocking_inference_holds_the_policy_lock_for_the_whole_update(unroll_batch):
    problem = load_problem("cartpole", {"algorithm": "ppo", "epochs": "2", "minibatches": "2"})
    agent = problem.make_agent()
    batch = unroll_batch(problem, agent)
    policy = PolicyVersion()
    trainer = Trainer(problem, agent, problem.make_optimizer(agent.parameters()), policy, torch.device("cpu"),
                      block_inference_on_training=True)
    versions_seen_by_inference = []
    original = trainer._step

    def step_then_probe(*args):
        result = original(*args)
        probe = threading.Thread(target=lambda: policy.lock.acquire(timeout=0.05) and (
            versions_seen_by_inference.append(policy.version), policy.lock.release()))
        probe.start()
        probe.join()
        return result

    trainer._step = step_then_probe
    trainer.update(batch)
    # Another thread (inference) never got the lock between the update's optimizer steps.
    assert versions_seen_by_inference == []
    assert policy.lock.acquire(timeout=1)
    policy.lock.release()


def test_a_batch_size_that_minibatches_do_not_divide_is_refused_at_start(tmp_path):
    from fleetrl.learner.config import LearnerConfig
    from fleetrl.learner.learner import Learner

    config = LearnerConfig(problem="cartpole", hparams={"algorithm": "ppo", "minibatches": "4"}, batch_size=6,
                           logdir=str(tmp_path), bind="127.0.0.1:0")
    with pytest.raises(ValueError, match="batch_size 6 does not split into the Problem's 4 minibatches"):
        Learner(config)


def test_accumulated_microbatches_make_the_same_step_as_the_whole_minibatch(unroll_batch):
    """With every step valid and advantages normalized over the whole batch (V-trace does
    not normalize), two microbatches of 4 unrolls add up to the gradient of all 8."""
    results = []
    for steps in (1, 2):
        problem = load_problem("cartpole", {"accumulation_steps": str(steps)})
        torch.manual_seed(0)
        agent = problem.make_agent()
        batch = unroll_batch(problem, agent)
        trainer = Trainer(problem, agent, torch.optim.SGD(agent.parameters(), lr=0.1), PolicyVersion(),
                          torch.device("cpu"))
        trainer.update(batch)
        results.append([p.detach().clone() for p in agent.parameters()])
    for whole, accumulated in zip(*results):
        torch.testing.assert_close(accumulated, whole, atol=1e-6, rtol=1e-5)


def test_accumulation_steps_must_divide_the_minibatch(unroll_batch):
    problem = load_problem("cartpole", {"accumulation_steps": "3"})
    agent = problem.make_agent()
    trainer = Trainer(problem, agent, problem.make_optimizer(agent.parameters()), PolicyVersion(),
                      torch.device("cpu"))
    with pytest.raises(ValueError, match="batch_size 8 does not split into 1 minibatches of 3 microbatches"):
        trainer.update(unroll_batch(problem, agent))


def _one_update(unroll_batch, hparams):
    """A CartPole agent from seed 0, one update on a batch of its own; returns the trainer,
    the agent, the batch, the policy logits on the batch before the update, and the logs."""
    problem = load_problem("cartpole", hparams)
    torch.manual_seed(0)
    agent = problem.make_agent()
    batch = unroll_batch(problem, agent)
    with torch.no_grad():
        before = agent.unroll(batch.observation, batch.first, batch.initial_state)[0]["policy_logits"]
    trainer = Trainer(problem, agent, problem.make_optimizer(agent.parameters()), PolicyVersion(),
                      torch.device("cpu"))
    return trainer, agent, batch, before, trainer.update(batch)


def _batch_kl(agent, before, batch):
    with torch.no_grad():
        after = agent.unroll(batch.observation, batch.first, batch.initial_state, batch.action)[0]["policy_logits"]
    return categorical_kl(before, after).mean().item()


def test_the_anchor_keeps_each_state_nearer_the_policy_that_started_the_batch(unroll_batch):
    """Same batch, same start, same steps: with anchor_kl_cost the batch's states end nearer
    the policy before the update, and the loss logs the anchor's KL."""
    hparams = {"algorithm": "ppo", "epochs": "4", "minibatches": "2", "learning_rate": "0.02"}
    moved = {}
    for cost in ("0", "10"):
        trainer, agent, batch, before, logs = _one_update(unroll_batch, {**hparams, "anchor_kl_cost": cost})
        assert trainer.policy.version == 8
        assert ("ppo/anchor_kl" in logs) == (cost != "0")
        moved[cost] = _batch_kl(agent, before, batch)
    assert 0 < moved["10"] < 0.5 * moved["0"], moved


@pytest.mark.parametrize("hparams", [{"anchor_kl_cost": "1"}, {"max_state_kl": "0.1"}])
def test_the_anchor_and_the_state_trust_region_refuse_a_policy_without_logits_by_name(unroll_batch, hparams):
    problem = load_problem("pendulum", hparams)
    agent = problem.make_agent()
    trainer = Trainer(problem, agent, problem.make_optimizer(agent.parameters()), PolicyVersion(),
                      torch.device("cpu"))
    with pytest.raises(ValueError, match="max_state_kl need a categorical policy.*GaussianMLPAgent"):
        trainer.update(unroll_batch(problem, agent, observe=lambda rng, n: {
            "observation": rng.normal(size=(n, 3)).astype("float32")}))


@pytest.mark.parametrize("reset", [True, False])
def test_reset_momentum_each_batch_moves_every_weight_against_the_batchs_own_gradient(unroll_batch, reset):
    """One step per batch: with the first moment zeroed, Adam's step is -lr * g / (sqrt(v) + eps)
    coordinate by coordinate, so no weight keeps moving the way the previous batch pushed it."""
    problem = load_problem("cartpole", {"algorithm": "ppo", "epochs": "1", "minibatches": "1",
                                        "reset_momentum_each_batch": str(reset).lower()})
    torch.manual_seed(0)
    agent = problem.make_agent()
    first_batch, second_batch = unroll_batch(problem, agent), unroll_batch(problem, agent, num_envs=6)
    trainer = Trainer(problem, agent, problem.make_optimizer(agent.parameters()), PolicyVersion(),
                      torch.device("cpu"))
    trainer.update(first_batch)
    algorithm = problem.algorithm()
    agent.zero_grad()
    algorithm.loss(problem, agent, second_batch, algorithm.prepare(problem, second_batch)).loss.backward()
    gradient = torch.cat([p.grad.flatten() for p in agent.parameters()])
    before = torch.cat([p.detach().flatten() for p in agent.parameters()])
    trainer.update(second_batch)
    step = torch.cat([p.detach().flatten() for p in agent.parameters()]) - before
    moved = (gradient.abs() > 1e-6) & (step != 0)
    against = (torch.sign(step[moved]) == -torch.sign(gradient[moved])).float().mean().item()
    assert (against == 1.0) if reset else (against < 0.9), against


def test_max_state_kl_keeps_every_state_of_the_batch_within_the_bound(unroll_batch):
    """A learning rate that moves some states far in one batch: with max_state_kl no state of
    the batch ends further than the bound from the policy that started it, the step that
    went past it was shortened, and the batch's updates ended there."""
    hparams = {"algorithm": "ppo", "epochs": "4", "minibatches": "2", "learning_rate": "0.05"}
    largest = {}
    for bound in (None, "0.02"):
        trainer, agent, batch, before, logs = _one_update(
            unroll_batch, {**hparams, **({"max_state_kl": bound} if bound else {})})
        with torch.no_grad():
            after = agent.unroll(batch.observation, batch.first, batch.initial_state)[0]["policy_logits"]
        largest[bound] = categorical_kl(before[:-1], after[:-1]).max().item()
        if bound:
            assert 0 < logs["ppo/step_fraction"] < 1 and trainer.policy.version < 8
            assert logs["ppo/max_state_kl"] <= 0.02
    assert largest["0.02"] <= 0.02 < largest[None], largest


def test_max_state_kl_is_refused_outside_ppo_by_name():
    with pytest.raises(ValueError, match="max_state_kl applies to algorithm=ppo only"):
        load_problem("cartpole", {"algorithm": "vtrace", "max_state_kl": "0.1"})
    with pytest.raises(ValueError, match="max_state_kl"):
        load_problem("cartpole", {"algorithm": "ppo", "max_state_kl": "0"})


def test_an_optimizer_step_brings_its_logged_values_to_the_host_in_one_read(unroll_batch, monkeypatch):
    """Each float() or .item() of a device tensor waits for the device; the trainer reads all
    of a step's logged values (losses, KL, grad norm) in one transfer instead of one apiece."""
    problem = load_problem("cartpole", {"algorithm": "ppo", "epochs": "3", "minibatches": "4"})
    agent = problem.make_agent()
    batch = unroll_batch(problem, agent)
    trainer = Trainer(problem, agent, problem.make_optimizer(agent.parameters()), PolicyVersion(),
                      torch.device("cpu"))
    reads = []
    for name in ("__float__", "item", "tolist", "__bool__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    logs = trainer.update(batch)
    monkeypatch.undo()
    assert trainer.policy.version == 12 and {"loss/value", "ppo/approx_kl", "optim/grad_norm"} <= set(logs)
    assert len(reads) <= 12 + 1, reads  # a read per step, and the batch's policy lag
