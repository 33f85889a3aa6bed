"""The learning-rate schedule and the loss's reward scale."""

import threading

import pytest
import torch

from fleetrl.losses.lr_schedule import LearningRateSchedule
from fleetrl.problems import load_problem


def test_a_linear_schedule_decays_to_zero_over_the_budget_and_stays_there():
    schedule = LearningRateSchedule("linear", total_env_steps=1000)
    assert [schedule.factor(s) for s in (0, 250, 1000, 5000)] == pytest.approx([1.0, 0.75, 0.0, 0.0])
    assert LearningRateSchedule("constant", 1000).factor(999) == 1.0


def test_a_warmup_rises_linearly_over_its_updates_then_leaves_the_schedule_alone():
    warmup = LearningRateSchedule("constant", 0, warmup_updates=4)
    assert [warmup.factor(0, updates) for updates in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1, 1, 1])
    both = LearningRateSchedule("linear", 1000, warmup_updates=4)
    assert [both.factor(500, updates) for updates in (0, 3, 100)] == pytest.approx([0.125, 0.5, 0.5])


def test_a_warmup_ends_at_the_full_rate_when_batches_step_past_its_last_update():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([parameter], lr=1e-3)
    schedule = LearningRateSchedule("constant", 0, warmup_updates=5)
    for updates in (0, 2, 4):  # batches of 2 optimizer steps each
        schedule.apply(optimizer, 0, updates)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * (updates + 1) / 5)
    schedule.apply(optimizer, 0, 6)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)


def test_the_schedule_scales_each_parameter_group_from_its_own_rate():
    first, second = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([{"params": [first]}, {"params": [second], "lr": 1e-4}], lr=2e-3)
    schedule = LearningRateSchedule("linear", 100)
    for steps in (50, 75):  # applied again, it scales the initial rates, not the last ones
        schedule.apply(optimizer, steps)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([5e-4, 2.5e-5])
    LearningRateSchedule("constant", 100).apply(optimizer, 0)  # leaves the optimizer alone
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([5e-4, 2.5e-5])


def test_without_a_budget_a_linear_schedule_keeps_its_rate_and_the_learner_says_so(tmp_path, caplog):
    from fleetrl.learner.config import LearnerConfig
    from fleetrl.learner.learner import Learner

    assert LearningRateSchedule("linear", total_env_steps=0).factor(10**6) == 1.0
    Learner(LearnerConfig(problem="cartpole", hparams={"learning_rate_schedule": "linear"},
                          logdir=str(tmp_path), bind="127.0.0.1:0"))
    assert "decays over --total_env_steps, and this run has none" in caplog.text


def test_an_unknown_schedule_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown learning_rate_schedule 'cosine'"):
        load_problem("cartpole", {"learning_rate_schedule": "cosine"})


def test_a_training_learner_decays_the_rate_as_env_steps_are_served(tmp_path, local_run):
    """A real run, one learner and one actor in this process: the rate the optimizer steps
    with falls from learning_rate towards 0 over total_env_steps."""
    from fleetrl.actor.actor import Actor
    from fleetrl.actor.config import ActorConfig
    from fleetrl.learner.config import LearnerConfig
    from fleetrl.learner.learner import Learner

    learner = Learner(LearnerConfig(problem="cartpole", hparams={"learning_rate_schedule": "linear"},
                                    total_env_steps=6000, batch_size=4, unroll_length=16, logdir=str(tmp_path),
                                    bind="127.0.0.1:0", summary_interval_s=0.2))
    actor = threading.Thread(target=Actor(ActorConfig(learner_address=learner.address, num_envs=8)).run, daemon=True)
    actor.start()
    summary = learner.run()
    actor.join(timeout=60)
    assert summary.reason.startswith("total_env_steps reached")
    rates = local_run.read_scalars(tmp_path)["optim/learning_rate"]
    rate = learner.problem.config.learning_rate
    # 0 is right for a batch trained after the budget's last env step was served.
    assert len(rates) >= 3 and all(0 <= r <= rate for r in rates)
    assert rates[0] > 0.7 * rate and rates[-1] < 0.3 * rate, rates
    assert rates == sorted(rates, reverse=True), rates


def test_the_learner_warms_up_over_its_first_updates_and_a_resumed_run_does_not(tmp_path, unroll_batch):
    from fleetrl.learner.config import LearnerConfig
    from fleetrl.learner.learner import Learner

    learner = Learner(LearnerConfig(problem="cartpole", hparams={"learning_rate_warmup_updates": "10"},
                                    logdir=str(tmp_path), bind="127.0.0.1:0"))
    batch = unroll_batch(learner.problem, learner.agent)
    rate = learner.problem.config.learning_rate
    learner.lr_schedule.apply(learner.optimizer, 0, learner.policy.version)
    assert learner.trainer.update(batch)["optim/learning_rate"] == pytest.approx(rate / 10)
    learner.policy.version = 25  # as a resumed run's, whose Adam has its history back
    learner.lr_schedule.apply(learner.optimizer, 0, learner.policy.version)
    assert learner.trainer.update(batch)["optim/learning_rate"] == pytest.approx(rate)
    with pytest.raises(ValueError, match="learning_rate_warmup_updates must be in"):
        load_problem("cartpole", {"learning_rate_warmup_updates": "-1"})


def test_the_reward_scale_scales_the_rewards_the_loss_sees(unroll_batch):
    plain, scaled = load_problem("cartpole", {"reward_scale": "1"}), load_problem("cartpole", {"reward_scale": "0.1"})
    batch = unroll_batch(plain, plain.make_agent())
    rewards = {name: p.algorithm().prepare(p, batch)["rewards"] for name, p in (("plain", plain), ("scaled", scaled))}
    assert rewards["plain"].abs().sum() > 0
    torch.testing.assert_close(rewards["scaled"], rewards["plain"] * 0.1)
    with pytest.raises(ValueError, match="reward_scale"):
        load_problem("cartpole", {"reward_scale": "0"})
