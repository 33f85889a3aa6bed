"""LIBERO's released demonstrations, replayed as an env, for supervised warm starts.

LIBERO ships its demonstrations as one HDF5 file per task (robomimic's layout):

    data/demo_<i>/actions               [T, 7] float
    data/demo_<i>/obs/agentview_rgb     [T, H, W, 3] uint8 (upside down, as the simulator renders)
    data/demo_<i>/obs/eye_in_hand_rgb   [T, H, W, 3] uint8
    data/demo_<i>/obs/ee_pos, ee_ori, gripper_states   [T, 3], [T, 3], [T, 2]
    data.attrs["problem_info"]          JSON with "language_instruction"

`LiberoDemoReplay` plays one demonstration per episode and has `LiberoEnv`'s observations
(the images turned upright and resized, the state as end-effector position, axis-angle and
gripper joints, the instruction's bytes, the task id) plus the demonstration's next
`chunk_size` actions under "oracle_action" (the last one repeated past the end). The
action it is given is ignored: the next observation is the demonstration's next one, so
a run with `teacher_forcing_fraction=1` and `algorithm=supervised` trains on the
demonstrations through the whole system (actors, learner, checkpoints). The last step
ends the episode as a success, as every released demonstration does.

Nothing is downloaded: `paths` are local files (`--demo_files`); the tests write tiny
ones in this layout.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from fleetrl.envs.libero.env import action_space, encode_language, observation_space

IMAGE_KEYS = {"main_image": "agentview_rgb", "wrist_image": "eye_in_hand_rgb"}
STATE_KEYS = ("ee_pos", "ee_ori", "gripper_states")


def read_instruction(path: str, data) -> str:
    """The file's instruction; without one, the task's name from the file name, as LIBERO names them."""
    info = data.attrs.get("problem_info")
    if info is not None:
        text = json.loads(info if isinstance(info, str) else info.decode()).get("language_instruction")
        if text:
            return str(text)
    name = os.path.basename(path).removesuffix(".hdf5").removesuffix("_demo")
    words = [w for w in name.split("_") if not w.isupper() and not w.isdigit()]
    return " ".join(words)


class LiberoDemoReplay(gym.Env):
    def __init__(self, paths: Sequence[str], image_size: int = 128, chunk_size: int = 1):
        try:
            import h5py
        except ImportError as e:  # h5py comes with the libero extra
            from fleetrl.common.extras import MissingExtra

            raise MissingExtra("LIBERO's demonstration files", "libero", e) from e
        if not paths:
            raise ValueError("no demonstration files given (--demo_files)")
        self.image_size, self.chunk_size = image_size, chunk_size
        self._demos: list[tuple[int, str, dict[str, np.ndarray]]] = []  # (task, instruction, arrays)
        for task, path in enumerate(paths):
            if not os.path.isfile(path):
                raise ValueError(f"--demo_files: no file at {path}")
            with h5py.File(path, "r") as f:
                if "data" not in f:
                    raise ValueError(f"{path}: no data/ group, so not a LIBERO demonstration file")
                instruction = read_instruction(path, f["data"])
                for name in sorted(f["data"], key=lambda n: int(n.split("_")[-1])):
                    demo = f["data"][name]
                    needed = ["actions", *(f"obs/{k}" for k in (*IMAGE_KEYS.values(), *STATE_KEYS))]
                    missing = [key for key in needed if key not in demo]
                    if missing:
                        raise ValueError(f"{path}: {name} lacks {', '.join(missing)} (LIBERO's layout: "
                                         f"{', '.join(needed)})")
                    arrays = {"actions": np.asarray(demo["actions"], np.float32),
                              **{key: np.asarray(demo["obs"][source]) for key, source in IMAGE_KEYS.items()},
                              "state": np.concatenate([np.asarray(demo["obs"][k], np.float32) for k in STATE_KEYS],
                                                      axis=-1)}
                    if arrays["actions"].shape[-1] != 7 or arrays["state"].shape[-1] != 8:
                        raise ValueError(f"{path}: {name} has {arrays['actions'].shape[-1]}-dim actions and a "
                                         f"{arrays['state'].shape[-1]}-dim state; LIBERO's are 7 and 8")
                    self._demos.append((task, instruction, arrays))
        if not self._demos:
            raise ValueError(f"no demonstrations in {', '.join(paths)}")
        # The env's observations, with the demonstration's next chunk as the oracle's.
        self.observation_space = gym.spaces.Dict({
            **observation_space(image_size, num_tasks=len(paths)).spaces,
            "oracle_action": gym.spaces.Box(-1, 1, (chunk_size, 7), np.float32),
        })
        self.action_space = action_space()
        self._demo, self._t = 0, 0

    @property
    def num_demos(self) -> int:
        return len(self._demos)

    @property
    def instructions(self) -> list[str]:
        """Each file's instruction, in the files' order."""
        return list(dict.fromkeys(instruction for _, instruction, _ in self._demos))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """options={"demo_index": i} plays that demonstration; otherwise one is drawn."""
        super().reset(seed=seed)
        options = options or {}
        self._demo = int(options["demo_index"]) % self.num_demos if "demo_index" in options \
            else int(self.np_random.integers(self.num_demos))
        self._t = 0
        task = self._demos[self._demo][0]
        return self._observation(), {"task_id": task, "demo_index": self._demo}

    def step(self, action):
        task, _, arrays = self._demos[self._demo]
        self._t += 1
        length = len(arrays["actions"])
        done = self._t >= length - 1
        info = {"task_id": task, "success": float(done), "success_once": float(done), "episode_len": self._t,
                "demo_index": self._demo}
        return self._observation(), 0.0, done, False, info

    def _image(self, frames: np.ndarray) -> np.ndarray:
        frame = frames[min(self._t, len(frames) - 1)][::-1, ::-1]  # upright, as LiberoEnv's
        if frame.shape[0] != self.image_size:
            rows = (np.arange(self.image_size) * frame.shape[0] / self.image_size).astype(int)
            cols = (np.arange(self.image_size) * frame.shape[1] / self.image_size).astype(int)
            frame = frame[rows][:, cols]
        return np.ascontiguousarray(frame, np.uint8)

    def _observation(self) -> dict[str, np.ndarray]:
        task, instruction, arrays = self._demos[self._demo]
        actions = arrays["actions"]
        index = np.minimum(np.arange(self._t, self._t + self.chunk_size), len(actions) - 1)
        return {"main_image": self._image(arrays["main_image"]), "wrist_image": self._image(arrays["wrist_image"]),
                "state": arrays["state"][min(self._t, len(actions) - 1)], "language": encode_language(instruction),
                "task_id": np.int64(task), "oracle_action": np.clip(actions[index], -1, 1).astype(np.float32)}
