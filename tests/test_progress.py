"""The launchers' progress line."""

from fleetrl.launch.progress import Progress, print_summary
from fleetrl.proto import learner_pb2 as pb


def test_without_a_terminal_the_last_status_is_printed_at_the_end(capsys):
    progress = Progress(interactive=False)
    progress.show(pb.Status(env_steps=100))
    progress.show(pb.Status(env_steps=200, eval_rounds=1, eval_mean_return=42.0))  # within 10 s: held back
    assert "200" not in capsys.readouterr().out
    progress.end()
    last = capsys.readouterr().out
    assert "env steps        200" in last and "eval return 42.0" in last
    progress.end()  # printed once
    assert capsys.readouterr().out == ""


def test_a_warm_start_shows_its_loss_and_an_eval_round_its_best_metric(capsys):
    progress = Progress(interactive=False)
    progress.show(pb.Status(env_steps=300, losses={"total": 0.5, "teacher_forcing": 0.25}, eval_rounds=2,
                            eval_metric="success", eval_metric_value=0.375, eval_mean_return=0.4,
                            eval_policy_version=12))
    line = capsys.readouterr().out
    assert "(0 eps)" in line and "| actors 0 | loss teacher_forcing 0.25 |" in line
    assert line.rstrip().endswith("| eval success 0.38, return 0.4 @ v12")
    progress.show(pb.Status(env_steps=400, episodes=3, mean_episode_return=1.0, losses={"total": 0.5}))
    progress.end()
    assert "loss" not in capsys.readouterr().out  # episodes to show: their return is the figure to watch


def test_a_summary_without_episodes_prints_a_dash_for_its_mean_return(capsys):
    """summary.json writes a NaN mean as null (strict JSON); a run that ended before any
    episode, a teacher-forced warm start say, prints its summary all the same."""
    print_summary({"reason": "budget reached", "env_steps": 9931, "episodes": 0, "return_window": 100,
                   "mean_episode_return": None, "returns_in_window": 0, "trainer_steps": 574, "wall_s": 63.0})
    assert "mean return of the last 100 - | trainer steps 574" in capsys.readouterr().out


def test_the_watch_command_fits_the_problem_it_plays(monkeypatch, tmp_path):
    """The command printed at a run's end runs as printed: a user's Problem keeps its
    PYTHONPATH and is named; a heavy simulator plays a few episodes on one env, with a note
    on the whole eval set; --record only where there is something to draw."""
    import shlex

    from fleetrl.launch.progress import HEAVY_EVAL_ENVS, HEAVY_EVAL_EPISODES, watch_command
    from fleetrl.problems.cartpole import CartPoleProblem
    from fleetrl.problems.continuous_control import PendulumProblem

    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "my code"))
    command, note = watch_command("runs/a", "cartpole", CartPoleProblem.from_hparams({}))
    assert command.endswith("-m fleetrl.launch.evaluate --checkpoint=runs/a --record") and note == ""
    assert "PYTHONPATH" not in command  # a built-in Problem needs none

    command, _ = watch_command("runs/a", "my_pkg.nav:MyProblem", CartPoleProblem.from_hparams({}))
    words = shlex.split(command)
    assert words[0] == f"PYTHONPATH={tmp_path / 'my code'}" and "--problem=my_pkg.nav:MyProblem" in words

    class Heavy(CartPoleProblem):
        envs_in_subprocesses = True

    command, note = watch_command("runs/a", "cartpole", Heavy.from_hparams({}))
    assert f"--episodes={HEAVY_EVAL_EPISODES} --num_envs={HEAVY_EVAL_ENVS}" in command
    assert "--record" not in command  # no image observation, and no env built to ask it to draw
    assert "--episodes=0 plays them all" in note and f"of the {Heavy.from_hparams({}).num_eval_episodes()} " in note

    class Blind(PendulumProblem):
        def make_env(self):
            import gymnasium as gym

            return gym.make("Pendulum-v1")  # no render_mode: nothing to draw

    command, _ = watch_command("runs/a", "pendulum", Blind.from_hparams({}))
    assert "--record" not in command
