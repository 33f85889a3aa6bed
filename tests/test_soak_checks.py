"""The soak bench's checks (bench/soak_checks.py): its episode accounting and its reading
of TensorBoard's step axis, on made-up windows and real event files."""

from torch.utils.tensorboard import SummaryWriter

from fleetrl.bench.soak_checks import ActorCounts, scan_steps, window_episodes

TAG = "throughput/env_steps_per_s"


def counts(answered, finished=None, alive=True) -> ActorCounts:
    return ActorCounts(answered, answered if finished is None else finished, alive)


def test_a_window_counts_exactly_what_was_answered_and_flags_any_difference():
    start = {"a": counts(10), "b": counts(5)}
    end = {"a": counts(14), "b": counts(5), "c": counts(2)}  # c began in the window
    assert window_episodes(6, start, end, after_restart=False) == (6, 6, 0, 0)
    assert window_episodes(7, start, end, after_restart=False).double == 1
    assert window_episodes(5, start, end, after_restart=False).lost == 1


def test_an_actor_that_died_in_flight_may_or_may_not_have_been_counted():
    start = {"a": counts(10), "gone": counts(3, alive=False)}
    end = {"a": counts(12, finished=12, alive=False), "gone": counts(3, finished=5, alive=False)}
    # a died with nothing in flight; "gone" died before the window, its in-flight is not this window's.
    assert window_episodes(2, start, end, after_restart=False).double == 0
    assert window_episodes(3, start, end, after_restart=False).double == 1
    end["a"] = counts(12, finished=14, alive=False)  # two episodes in its last, unanswered step
    assert [window_episodes(n, start, end, after_restart=False).double for n in (2, 3, 4, 5)] == [0, 0, 0, 1]


def test_after_a_restart_the_resent_steps_count_unless_the_checkpoint_had_them():
    at_kill = {"a": counts(10, finished=12)}  # two episodes in flight at the kill, resent and answered
    end = {"a": counts(12)}
    for counted in (0, 2):  # the checkpoint had them, or not
        assert window_episodes(counted, at_kill, end, after_restart=True)[2:] == (0, 0)
    assert window_episodes(3, at_kill, end, after_restart=True).double == 1
    # Not after a restart, in-flight steps at the start were counted before the window.
    assert window_episodes(0, at_kill, end, after_restart=False).lost == 2


def test_the_step_axis_follows_restart_markers_and_finds_regressions_and_gaps(tmp_path):
    first = SummaryWriter(str(tmp_path))
    for step in range(0, 60, 10):
        first.add_scalar(TAG, 1.0, step)
    first.close()
    # A learner that resumed at step 30: TensorBoard drops the first one's points from 30 on.
    resumed = SummaryWriter(str(tmp_path), purge_step=30)
    for step in (30, 45, 80):
        resumed.add_scalar(TAG, 1.0, step)
    resumed.add_scalar("other/tag", 1.0, 500)
    resumed.close()
    assert scan_steps(str(tmp_path), TAG) == (6, 0, 35)  # 0 10 20 30 45 80

    # A writer that goes back without a restart marker.
    again = SummaryWriter(str(tmp_path))
    again.add_scalar(TAG, 1.0, 50)
    again.close()
    axis = scan_steps(str(tmp_path), TAG)
    assert axis.regressions == 1 and axis.points == 6  # 0 10 20 30 45 50
