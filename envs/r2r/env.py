"""A VALAN-style Room-to-Room environment on connectivity graphs and precomputed features.

Observation (fixed shapes, so actors can batch it):
  instruction      [L] int32      token ids, padded
  pano             [36, D] float32 the current viewpoint's views
  candidates       [C, D] float32  slot 0 is STOP (zeros), then one row per neighbour: the
                                   level view that faces it; padded to C = max_conns
  candidate_angles [C, 4] float32  sin/cos of the heading relative to the agent's, and of
                                   the elevation
  candidate_mask   [C] int8        1 for valid slots
  oracle_action    [] int64        the slot on the shortest path to the goal (STOP there)

Action: a slot. The episode ends at STOP or after `max_steps` moves. Headings follow R2R:
radians in [0, 2π), 0 facing +y, clockwise. The agent looks level at the start, and each
move looks through the view that faces the next viewpoint, one of three rows at -30, 0 or
+30 degrees: that row's elevation is the step's elevation in the trajectory. Rewards: "distance"
(VALAN's: the metres gained towards the goal, clipped to [-1, 1], then +-4 for stopping at
the goal or not) or "dtw" (the decrease of DTW to the reference path, then the same
stop bonus). The final info holds the trajectory and the VLN metrics (see `metrics`).

A split without goals (R2R's test split, whose paths hold only their start) is for
writing results files: its episodes pay no reward and report only the path length and
the steps taken, since SR, SPL, nDTW and the rest need the goal.
"""

from __future__ import annotations

import dataclasses
import math
import os

import gymnasium as gym
import numpy as np

from fleetrl.envs.r2r import metrics as vln
from fleetrl.envs.r2r.features import VIEWS, load_features
from fleetrl.envs.r2r.graph import DataError, ScanGraph, cached_scan_graph
from fleetrl.envs.r2r.instructions import Episode, check_paths, read_instructions
from fleetrl.envs.r2r.vocab import Vocab

STOP = 0
REWARDS = ("distance", "dtw")


@dataclasses.dataclass
class R2RData:
    """Where a dataset's files are, in the layout the synthetic generator writes and real R2R uses."""

    data_dir: str
    feature_file: str = "features.tsv"
    feature_dim: int = 32
    vocab_file: str = "vocab.txt"

    def path(self, name: str) -> str:
        return name if os.path.isabs(name) else os.path.join(self.data_dir, name)


class R2REnv(gym.Env):
    def __init__(self, data: R2RData, splits: tuple[str, ...] = ("train",), scans: tuple[str, ...] = (),
                 max_instruction_len: int = 40, max_conns: int = 14, max_steps: int = 12,
                 reward: str = "distance", stop_bonus: float = 4.0):
        if reward not in REWARDS:
            raise ValueError(f"unknown reward {reward!r}; choose from {REWARDS}")
        self.data, self.reward_kind, self.stop_bonus = data, reward, stop_bonus
        self.max_steps, self.max_conns, self.max_instruction_len = max_steps, max_conns, max_instruction_len
        self.vocab = Vocab.read(data.path(data.vocab_file))
        self.features = load_features(data.path(data.feature_file), data.feature_dim)
        self.episodes: dict[str, list[Episode]] = {}
        for split in splits:
            episodes = read_instructions(data.path(f"R2R_{split}.json"))
            # A shard: only this actor's scans (real R2R is too big to load everywhere).
            self.episodes[split] = [e for e in episodes if not scans or e.scan in scans]
        self.graphs: dict[str, ScanGraph] = {}
        for split, episodes in self.episodes.items():
            for scan in sorted({e.scan for e in episodes}):
                self.graphs[scan] = cached_scan_graph(data.path("connectivity"), scan)
            check_paths(episodes, self.graphs, data.path(f"R2R_{split}.json"))
        self.action_space = gym.spaces.Discrete(max_conns)
        dim = self.features.dim
        self.observation_space = gym.spaces.Dict({
            "instruction": gym.spaces.Box(0, len(self.vocab) - 1, (max_instruction_len,), np.int32),
            "pano": gym.spaces.Box(-np.inf, np.inf, (VIEWS, dim), np.float32),
            "candidates": gym.spaces.Box(-np.inf, np.inf, (max_conns, dim), np.float32),
            "candidate_angles": gym.spaces.Box(-1, 1, (max_conns, 4), np.float32),
            "candidate_mask": gym.spaces.MultiBinary(max_conns),
            "oracle_action": gym.spaces.Discrete(max_conns),
        })

    # ----- episode control -----

    def reset(self, *, seed=None, options=None):
        """options: {"split": name, "index": i} plays that instruction; otherwise a random
        instruction of the first split."""
        super().reset(seed=seed)
        options = options or {}
        split = options.get("split", next(iter(self.episodes)))
        if split not in self.episodes:
            raise ValueError(f"split {split!r} is not loaded; loaded: {list(self.episodes)}")
        episodes = self.episodes[split]
        if not episodes:
            raise DataError(f"split {split!r} has no episodes in this env's scans")
        index = options.get("index", int(self.np_random.integers(len(episodes))))
        self.split, self.index, self.episode = split, index, episodes[index]
        self.graph = self.graphs[self.episode.scan]
        self.instruction = self.vocab.encode(self.episode.instruction, self.max_instruction_len)
        self.trajectory = [self.episode.path[0]]
        self.heading = self.episode.heading % (2 * math.pi)
        self.headings, self.elevations = [self.heading], [0.0]
        self.steps = 0
        return self._observe(), {}

    def step(self, action):
        slot = int(action)
        if not (0 <= slot < len(self._slots) + 1):
            raise ValueError(f"action {slot} is not a valid slot here (0 = STOP, 1..{len(self._slots)} move)")
        here = self.trajectory[-1]
        if slot == STOP:
            return self._end(0.0, terminated=True)
        there = self._slots[slot - 1]
        self.heading = self.graph.heading(here, there)
        before = self._progress()
        self.trajectory.append(there)
        self.headings.append(self.heading)
        self.elevations.append(view_elevation(self.graph.elevation(here, there)))
        self.steps += 1
        if not self.has_goal:
            reward = 0.0
        elif self.reward_kind == "distance":
            reward = float(np.clip(before - self._progress(), -1.0, 1.0))
        else:
            reward = before - self._progress()
        if self.steps >= self.max_steps:
            return self._end(reward, terminated=False)
        return self._observe(), reward, False, False, {}

    @property
    def has_goal(self) -> bool:
        """False on a split without ground truth (test), whose paths hold only the start."""
        return len(self.episode.path) > 1

    def _progress(self) -> float:
        """What the reward's shaping measures: distance to the goal, or DTW to the reference."""
        if self.reward_kind == "distance":
            return self.graph.distance(self.trajectory[-1], self.episode.path[-1])
        return vln.dtw(vln.collapse_repeats(self.trajectory), self.episode.path, self.graph.distance)

    def _end(self, reward: float, terminated: bool):
        if self.has_goal:
            at_goal = self.trajectory[-1] == self.episode.path[-1]
            reward += self.stop_bonus if at_goal and terminated else -self.stop_bonus
            metrics = vln.episode_metrics(self.trajectory, self.episode.path, self.graph.distance)
        else:
            metrics = {"PL": vln.path_length(vln.collapse_repeats(self.trajectory), self.graph.distance),
                       "steps": float(self.steps)}
        info = {"instr_id": self.episode.instr_id, "split": self.split, "index": self.index, "scan": self.episode.scan,
                "reference": list(self.episode.path), "trajectory": list(self.trajectory),
                "headings": list(self.headings), "elevations": list(self.elevations), "metrics": metrics}
        return self._observe(), reward, terminated, not terminated, info

    # ----- observation -----

    def _observe(self) -> dict[str, np.ndarray]:
        here = self.trajectory[-1]
        pano = self.features(self.episode.scan, here)
        neighbours = sorted(self.graph.neighbours(here), key=lambda v: self.graph.heading(here, v))
        if len(neighbours) > self.max_conns - 1:
            raise DataError(f"scan {self.episode.scan} viewpoint {here} has {len(neighbours)} neighbours; "
                            f"raise max_conns above {self.max_conns}")
        self._slots = neighbours
        candidates = np.zeros((self.max_conns, self.features.dim), np.float32)
        angles = np.zeros((self.max_conns, 4), np.float32)
        mask = np.zeros(self.max_conns, np.int8)
        mask[STOP] = 1
        for i, there in enumerate(neighbours, 1):
            heading = self.graph.heading(here, there)
            elevation = self.graph.elevation(here, there)
            candidates[i] = pano[level_view(heading, elevation)]
            relative = heading - self.heading
            angles[i] = (math.sin(relative), math.cos(relative), math.sin(elevation), math.cos(elevation))
            mask[i] = 1
        return {"instruction": self.instruction, "pano": np.asarray(pano, np.float32), "candidates": candidates,
                "candidate_angles": angles, "candidate_mask": mask,
                "oracle_action": np.int64(self.oracle_action())}

    def oracle_action(self) -> int:
        """The slot of the next viewpoint on the shortest path to the goal; STOP at the goal."""
        here, goal = self.trajectory[-1], self.episode.path[-1]
        if here == goal:
            return STOP
        return 1 + self._slots.index(self.graph.shortest_path(here, goal)[1])


def view_row(elevation: float) -> int:
    """The row of R2R's 36 views nearest `elevation`: 0 at -30 degrees, 1 level, 2 at +30."""
    return 1 + int(np.clip(round(elevation / (math.pi / 6)), -1, 1))


def view_elevation(elevation: float) -> float:
    """The elevation of the view row nearest `elevation`, in radians."""
    return (view_row(elevation) - 1) * math.pi / 6


def level_view(heading: float, elevation: float) -> int:
    """The index (of 36) of the view facing `heading` at the elevation row nearest `elevation`."""
    return 12 * view_row(elevation) + int(round((heading % (2 * math.pi)) / (math.pi / 6))) % 12
