"""The launchers' progress line."""

from fleetrl.launch.progress import Progress
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
