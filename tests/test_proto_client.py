"""The protocol is self-describing: a client written from learner.proto alone trains a learner.

The client below compiles nothing of fleetrl's and imports none of it: the test generates
the message and service modules from `proto/learner.proto` into a temporary folder (as any
other language's client would), and the client learns the Problem, the specs of its
handshake and the envs-per-actor rule from GetRunInfo, then steps Gymnasium's CartPole
with next-step autoreset as the proto's comments describe.
"""

import json
import shutil
import subprocess
import sys
import textwrap

from grpc_tools import protoc

CLIENT = textwrap.dedent('''
    import json, queue, secrets, sys

    import grpc
    import gymnasium as gym
    import numpy as np

    import learner_pb2 as pb
    import learner_pb2_grpc as pb_grpc

    DTYPES = {pb.FLOAT32: np.float32, pb.FLOAT64: np.float64, pb.INT64: np.int64, pb.INT32: np.int32,
              pb.UINT8: np.uint8, pb.BOOL: np.bool_}

    def tensor(name, array, dtype):
        array = np.ascontiguousarray(array, DTYPES[dtype]).astype(np.dtype(DTYPES[dtype]).newbyteorder("<"))
        return pb.Tensor(name=name, dtype=dtype, shape=list(array.shape), data=array.tobytes())

    address, steps = sys.argv[1], int(sys.argv[2])
    stub = pb_grpc.LearnerStub(grpc.insecure_channel(address))
    info = stub.GetRunInfo(pb.RunInfoRequest(), timeout=10)
    assert info.problem == "cartpole", info.problem
    (obs_spec,), (action_spec,) = info.observation_spec, info.action_spec
    n = 4 * info.num_envs_multiple
    envs = [gym.make("CartPole-v1", max_episode_steps=50) for _ in range(n)]
    obs = np.stack([env.reset(seed=i)[0] for i, env in enumerate(envs)])
    reward, terminated, truncated = np.zeros(n), np.zeros(n, bool), np.zeros(n, bool)
    run_ids = [secrets.randbits(63) | 1 for _ in range(n)]

    def messages():
        yield pb.ActorMessage(handshake=pb.Handshake(
            protocol_version=info.protocol_version, problem=info.problem, actor_id="proto-only", num_envs=n,
            observation_spec=info.observation_spec, action_spec=info.action_spec, extra_spec=info.extra_spec,
            mode=pb.TRAIN))
        while (message := outbox.get()) is not None:
            yield message

    outbox = queue.SimpleQueue()

    def step_message():
        return pb.ActorMessage(step=pb.Step(
            env_indices=range(n), run_ids=run_ids, rewards=reward.tolist(), terminated=terminated.tolist(),
            truncated=truncated.tolist(), observations=[tensor(obs_spec.name, obs, obs_spec.dtype)]))

    outbox.put(step_message())
    replies = stub.Stream(messages())
    assert next(replies).WhichOneof("kind") == "accepted"
    versions, episodes = [], 0
    for _ in range(steps):
        reply = next(replies)
        assert reply.WhichOneof("kind") == "actions", reply
        (actions,) = reply.actions.actions
        assert actions.name == action_spec.name and list(actions.shape) == [n, *action_spec.shape]
        action = np.frombuffer(actions.data, np.dtype(DTYPES[actions.dtype]).newbyteorder("<"))
        versions.append(reply.actions.policy_version)
        for i, env in enumerate(envs):
            if terminated[i] or truncated[i]:  # next-step autoreset: the action is ignored
                obs[i], _ = env.reset()
                reward[i], terminated[i], truncated[i] = 0.0, False, False
                episodes += 1
            else:
                obs[i], reward[i], terminated[i], truncated[i], _ = env.step(int(action[i]))
        outbox.put(step_message())
    outbox.put(None)
    replies.cancel()
    print(json.dumps({"fleetrl_imported": any(m.split(".")[0] == "fleetrl" for m in sys.modules),
                      "versions": [versions[0], versions[-1]], "episodes": episodes, "envs": n}))
''')


def test_a_client_built_from_the_proto_alone_trains_cartpole(tmp_path, running_learner, repo_root):
    client_dir = tmp_path / "client"
    client_dir.mkdir()
    shutil.copy(repo_root / "proto" / "learner.proto", client_dir / "learner.proto")
    assert protoc.main(["protoc", f"-I{client_dir}", f"--python_out={client_dir}", f"--grpc_python_out={client_dir}",
                        str(client_dir / "learner.proto")]) == 0
    (client_dir / "client.py").write_text(CLIENT)
    with running_learner(tmp_path, batch_size=4, unroll_length=10) as learner:
        # -E -s: no PYTHONPATH and no user site; the script's folder comes first on sys.path.
        result = subprocess.run([sys.executable, "-E", "-s", str(client_dir / "client.py"), learner.address, "400"],
                                capture_output=True, text=True, timeout=300, cwd=client_dir)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout.strip().splitlines()[-1])
        status = learner.status()
    assert report["fleetrl_imported"] is False
    assert report["episodes"] >= report["envs"]  # 50-step episodes over 400 steps, each reset as the proto says
    # 400 steps of 4 envs in unrolls of 11 steps, 4 to a batch: the learner trained on them.
    assert status.env_steps >= 400 * report["envs"] * 0.9 and status.trainer_steps >= 20
    assert report["versions"][1] > report["versions"][0]
