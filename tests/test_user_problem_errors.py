"""Mistakes in a user's own Problem stop it with one line that names the fix: observations
that do not fit their space (at the actor's first reset and every one after it), actions
the env rejects, and a flow-VLA Problem's keys, dtypes, shapes, oracle and corpus."""

import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest

from fleetrl.actor.actor import Actor, ActorError
from fleetrl.actor.config import ActorConfig
from fleetrl.envs.space_check import EnvSpaceError, SpaceCheck

USER_MODULE = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np

    from fleetrl.agents import MLPAgent
    from fleetrl.problems.base import Problem


    class LineEnv(gym.Env):
        """Its space says a (1,) state; `bad_after` resets in, it returns (3,)."""

        observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def __init__(self, bad_after=0, reject_action=None):
            self.resets, self.bad_after, self.reject_action = 0, bad_after, reject_action

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.resets += 1
            self.t = 0
            size = 3 if self.resets > self.bad_after else 1
            return np.zeros(size, np.float32), {}

        def step(self, action):
            if action == self.reject_action:
                raise ValueError(f"action {action} is not allowed here")
            self.t += 1
            return np.zeros(1, np.float32), 0.0, self.t >= 2, False, {}


    class LineProblem(Problem):
        bad_after = 0
        reject_action = None

        def make_env(self):
            return LineEnv(self.bad_after, self.reject_action)

        def make_agent(self):
            return MLPAgent(1, 2, (8,))


    class LaterBadLine(LineProblem):
        bad_after = 3
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "line_user.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "line_user", raising=False)
    return "line_user"


@pytest.mark.parametrize("problem", ["LineProblem", "LaterBadLine"])
@pytest.mark.parametrize("async_envs", [False, True])
def test_an_observation_that_does_not_fit_its_space_stops_the_actor_in_one_line(serve, user_module, problem,
                                                                                async_envs):
    learner = serve(problem=f"{user_module}:{problem}")
    actor = Actor(ActorConfig(learner_address=learner.address, problem=f"{user_module}:{problem}", num_envs=2,
                              async_envs=async_envs))
    with pytest.raises(ActorError) as error:
        actor.run(max_steps=200)
    message = str(error.value)
    assert message == (f"problem {user_module}:{problem}: LineEnv.reset returned an observation that does not fit "
                       "its observation_space: observation has shape (3,) and dtype float32; the space says "
                       "shape (1,) and dtype float32")
    assert "\n" not in message
    assert (actor.steps_sent > 0) == (problem == "LaterBadLine")  # the first reset, or a later one
    assert not learner.status().finished


def test_an_action_outside_the_space_that_the_env_rejects_is_named_and_an_envs_own_error_left_as_is():
    class Env(gym.Env):
        observation_space, action_space = gym.spaces.Box(-1, 1, (1,), np.float32), gym.spaces.Box(-1, 1, (2,))

        def step(self, action):
            if np.abs(action).max() > 1:
                raise AssertionError("action out of bounds")
            raise ZeroDivisionError("the env's own bug")

    env = SpaceCheck(Env(), "my_pkg:MyProblem")
    with pytest.raises(EnvSpaceError, match=r"^problem my_pkg:MyProblem: Env.step rejected the action \(shape "
                                            r"\(2,\), dtype float64\), which is not in its action_space "
                                            r"Box\(-1\.0, 1\.0, \(2,\), float32\): AssertionError: action out "
                                            r"of bounds$"):
        env.step(np.array([1.5, 0.0]))
    with pytest.raises(ZeroDivisionError, match="the env's own bug"):  # an action of its space: the env's error
        env.step(np.zeros(2, np.float32))


def test_space_check_takes_float64_for_float32_and_refuses_a_float_image_or_a_missing_key():
    space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
                             "state": gym.spaces.Box(-1, 1, (2,), np.float32)})

    class Env(gym.Env):
        observation_space, action_space = space, gym.spaces.Discrete(2)

        def __init__(self, obs):
            self.obs = obs

        def reset(self, *, seed=None, options=None):
            return self.obs, {}

    good = {"image": np.zeros((4, 4, 3), np.uint8), "state": np.zeros(2)}  # float64: cast as gymnasium does
    SpaceCheck(Env(good), "p").reset()
    with pytest.raises(EnvSpaceError, match=r"observation\['image'\] has shape \(4, 4, 3\) and dtype float32; the "
                                            r"space says shape \(4, 4, 3\) and dtype uint8"):
        SpaceCheck(Env({**good, "image": np.zeros((4, 4, 3), np.float32)}), "p").reset()
    with pytest.raises(EnvSpaceError, match=r"observation lacks keys \['state'\] \(it has \['image'\]\)"):
        SpaceCheck(Env({"image": good["image"]}), "p").reset()


# ----- a flow-VLA Problem of one's own (docs/examples/point_line.py, broken one way at a time) -----


@pytest.fixture
def point_line(repo_root, monkeypatch):
    monkeypatch.syspath_prepend(str(repo_root / "docs" / "examples"))
    import point_line

    return point_line


def broken(point_line, change_spaces=None, **attributes):
    """PointLineProblem whose env's spaces `change_spaces(spaces dict, action space)` edits."""

    class Broken(point_line.PointLineProblem):
        def make_env(self):
            env = super().make_env()
            if change_spaces:
                spaces = dict(env.observation_space.spaces)
                action = change_spaces(spaces, env.action_space)
                env.observation_space = gym.spaces.Dict(spaces)
                env.action_space = action or env.action_space
            return env

    for name, value in attributes.items():
        setattr(Broken, name, value)
    return Broken


def box(shape, dtype=np.float32):
    return gym.spaces.Box(0, 255, shape, dtype)


FLOW_MISTAKES = {
    "no oracle": (lambda s, a: s.__delitem__("oracle_action"),
                  "teacher_forcing_fraction=1.0 and the observation has no 'oracle_action' (the oracle's next "
                  "actions, oracle_key); add it to make_env's observation, a float32 Box [chunk_size, action_dim] = "
                  "[4, 1]"),
    "an oracle of 3 actions": (lambda s, a: s.update(oracle_action=box((3, 1))),
                               "the oracle 'oracle_action' has shape (3, 1); it must be [chunk_size, action_dim] = "
                               "[4, 1]"),
    "no language": (lambda s, a: s.__delitem__("language"),
                    "the observation has no Box 'language' (the instruction's UTF-8 bytes, LANGUAGE_KEY); it has "
                    "['image', 'oracle_action', 'state']"),
    "no state": (lambda s, a: s.__delitem__("state"),
                 "the observation has no Box 'state' (the robot's state, STATE_KEY)"),
    "language as text": (lambda s, a: s.update(language=gym.spaces.Text(24)), "no Box 'language'"),
    "a float image": (lambda s, a: s.update(image=box((32, 32, 3))),
                      "image 'image' is float32 (32, 32, 3); the flow VLA reads uint8 RGB images of shape [H, W, 3]"),
    "a channels-first image": (lambda s, a: s.update(image=box((3, 32, 32), np.uint8)),
                               "(channels last: [H, W, 3], not [3, H, W])"),
    "a chunk as the env's action": (lambda s, a: gym.spaces.Box(-1, 1, (4, 1), np.float32),
                                    "make_env's action_space is (4, 1); the flow VLA needs a Box of one action, "
                                    "[action_dim] (fleetrl plays chunks of chunk_size=4 itself)"),
}


@pytest.mark.parametrize("mistake", sorted(FLOW_MISTAKES))
def test_a_flow_vla_problems_mistakes_are_refused_with_the_fix(point_line, mistake):
    change, message = FLOW_MISTAKES[mistake]
    problem = broken(point_line, change).from_hparams({"teacher_forcing_fraction": "1"})
    with pytest.raises(ValueError) as error:
        problem.observation_specs()
    assert str(error.value).startswith("Broken: ") and message in str(error.value), str(error.value)


def test_a_flow_vla_problem_under_other_key_names_says_which_attribute_names_them(point_line):
    problem = broken(point_line, STATE_KEY="proprio").from_hparams({})
    with pytest.raises(ValueError, match="no Box 'proprio' .* or set the class attribute naming the key"):
        problem.observation_specs()


def test_a_flow_vla_problem_without_a_corpus_is_told_what_to_write(point_line):
    problem = broken(point_line, corpus=point_line.FlowVLAProblem.corpus).from_hparams({})
    with pytest.raises(NotImplementedError, match=r"Broken has no corpus\(\): model_path=tiny trains its tokenizer "
                                                  r"on it\. Define corpus\(self\) -> list\[str\]"):
        problem.make_agent()


# ----- a step's observation of the wrong shape (the reset's is right) -----

class WrongStepEnv(gym.Env):
    observation_space = gym.spaces.Dict({"state": gym.spaces.Box(-1, 1, (1,), np.float32)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return {"state": np.zeros(1, np.float32)}, {}

    def step(self, action):
        return {"state": np.zeros(3, np.float32)}, 0.0, False, False, {}


@pytest.mark.parametrize("asynchronous", [False, True], ids=["in_process", "env_processes"])
def test_a_step_observation_of_the_wrong_shape_names_the_env_the_key_and_both_shapes(asynchronous):
    from fleetrl.envs.vector import make_vector_env

    envs = make_vector_env(WrongStepEnv, 2, asynchronous=asynchronous)
    try:
        envs.reset(seed=0)
        with pytest.raises(EnvSpaceError, match=r"^env 0 \(.+\): its step returned an observation that does not "
                                                r"fit its observation_space: observation\['state'\] has shape "
                                                r"\(3,\) and dtype float32; the space says shape \(1,\)"):
            envs.step(np.zeros(2, np.int64))
    finally:
        envs.close()
