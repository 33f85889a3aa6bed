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
