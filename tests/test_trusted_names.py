"""Names read from data never choose what is imported (issue 58): a learner's RunInfo, a
checkpoint's Problem and a gym env_id in a config name a module that only the user, on the
command line, may have imported. Each case plants a module that records being imported."""

import sys
from concurrent import futures

import grpc
import pytest
import torch

from fleetrl.actor.actor import Actor, ActorError
from fleetrl.actor.config import ActorConfig
from fleetrl.learner.run.checkpoint import CheckpointDir
from fleetrl.learner.run.saved_policy import load_policy
from fleetrl.problems import load_problem
from fleetrl.proto import PROTOCOL_VERSION
from fleetrl.proto import learner_pb2 as pb
from fleetrl.proto import learner_pb2_grpc as pb_grpc

PLANTED = "fleetrl_planted_module"


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """An importable module that writes a file when imported; the file's path."""
    marker = tmp_path / "imported"
    (tmp_path / f"{PLANTED}.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from fleetrl.problems.cartpole import CartPoleProblem as Planted\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, PLANTED, raising=False)
    return marker


class NamingLearner(pb_grpc.LearnerServicer):
    """A learner (a spoofed one, say) whose RunInfo names a Problem by import path."""

    def GetRunInfo(self, request, context):
        return pb.RunInfo(problem=f"{PLANTED}:Planted", protocol_version=PROTOCOL_VERSION)


def test_an_actor_does_not_import_the_module_a_learner_names(planted):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_LearnerServicer_to_server(NamingLearner(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        actor = Actor(ActorConfig(learner_address=f"127.0.0.1:{port}", num_envs=1))
        with pytest.raises(ActorError, match=rf"the learner at 127.0.0.1:{port} names problem "
                                             rf"'{PLANTED}:Planted', which is not a registered Problem.*pass "
                                             rf"--problem={PLANTED}:Planted"):
            actor.run(max_steps=1)
    finally:
        server.stop(0)
    assert not planted.exists() and PLANTED not in sys.modules


def test_a_checkpoints_problem_is_not_imported_unless_the_user_names_it(planted, tmp_path, running_learner):
    with running_learner(tmp_path, checkpoint_interval_s=0) as learner:
        logdir = learner.config.logdir
    path = CheckpointDir(f"{logdir}/checkpoints").latest()
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["problem"] = f"{PLANTED}:Planted"  # as someone else's checkpoint may say
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match=rf"checkpoint .* names problem '{PLANTED}:Planted', which is not a "
                                         rf"registered Problem.*pass --problem={PLANTED}:Planted"):
        load_policy(path)
    assert not planted.exists() and PLANTED not in sys.modules
    assert load_policy(path, problem=f"{PLANTED}:Planted").problem.name == "cartpole"  # named by the user
    assert planted.exists()


def test_a_gym_env_id_does_not_import_the_module_it_names(planted):
    for problem in ("gym", "continuous_control"):
        with pytest.raises(ValueError, match=rf"env_id='{PLANTED}:Env-v0' would make gymnasium import module "
                                             rf"'{PLANTED}'"):
            load_problem(problem, {"env_id": f"{PLANTED}:Env-v0"})
    assert not planted.exists() and PLANTED not in sys.modules
