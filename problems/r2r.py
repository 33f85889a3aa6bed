"""Room-to-Room navigation (`--problem=r2r`): V-trace mixed with teacher forcing, VALAN's recipe.

Half the episodes (`teacher_forcing_fraction`) follow the oracle's shortest-path action and
train with cross-entropy on it; the others act on the policy and train with V-trace. Eval
rounds play every instruction of each eval split once; metrics arrive per split, as
`eval/{split}/SR` and so on. The default data is fleetrl's synthetic dataset, generated on
first use; point `data_dir` (and `feature_file`, `feature_dim`) at real R2R data instead.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from PIL import Image

from fleetrl.agents import Agent, VLNAgent
from fleetrl.common.files import atomic_write_json
from fleetrl.common.settings import check_choice, setting
from fleetrl.envs.r2r import R2RData, R2REnv, Vocab, read_instructions
from fleetrl.envs.r2r.env import REWARDS
from fleetrl.envs.r2r.graph import cached_scan_graph
from fleetrl.envs.r2r.metrics import METRIC_NAMES
from fleetrl.envs.r2r.synthetic import SyntheticConfig, generate
from fleetrl.envs.r2r.topdown import draw_episode
from fleetrl.problems.base import Problem, ProblemConfig
from fleetrl.problems.defaults import LearnerDefaults
from fleetrl.problems.eval_records import EvalRecords

log = logging.getLogger(__name__)

SYNTHETIC_DIR = "data/r2r_synthetic"


@dataclasses.dataclass
class R2RConfig(ProblemConfig):
    algorithm: str = "vtrace"
    teacher_forcing_fraction: float = 0.5
    learning_rate: float = 1e-3
    discount: float = 0.95
    entropy_cost: float = 0.01
    # The dataset: connectivity/, scans.txt, R2R_{split}.json, the vocab and the features.
    # The default is fleetrl's synthetic dataset, generated here on first use (`python -m
    # fleetrl.launch.r2r_synthetic` writes one with other settings).
    data_dir: str = SYNTHETIC_DIR
    feature_file: str = "features.tsv"
    feature_dim: int = 32
    vocab_file: str = "vocab.txt"
    train_split: str = "train"
    eval_splits: tuple[str, ...] = ("val_seen", "val_unseen")
    # A shard for this actor: only these scans (empty: all). Actors may set it with their own --hparams.
    scans: tuple[str, ...] = ()
    max_instruction_len: int = 40
    max_conns: int = 14
    max_steps: int = 12
    reward: str = "distance"  # or "dtw"
    results_each_eval_round: bool = setting(
        True, "The learner writes each eval round's R2R results files, <logdir>/eval_records/"
              "results_{split}_{policy_version}.json; eval actors send the trajectories with the episodes.")
    hidden_size: int = 128
    embedding_size: int = 64

    def __post_init__(self):
        super().__post_init__()
        check_choice("reward", self.reward, REWARDS)


class R2RProblem(Problem, EvalRecords):
    name = "r2r"
    Config = R2RConfig
    learner_defaults = LearnerDefaults(unroll_length=12, batch_size=32)

    def _data(self) -> R2RData:
        config = self.config
        if config.data_dir == SYNTHETIC_DIR and not os.path.exists(config.data_dir):
            # Built aside and renamed, so processes starting together never see half a dataset.
            tmp = f"{config.data_dir}.tmp-{os.getpid()}"
            generate(SyntheticConfig(out=tmp))
            try:
                os.rename(tmp, config.data_dir)
            except OSError:  # another process got there first
                shutil.rmtree(tmp, ignore_errors=True)
        return R2RData(config.data_dir, config.feature_file, config.feature_dim, config.vocab_file)

    def make_env(self) -> gym.Env:
        config = self.config
        return R2REnv(self._data(), splits=(config.train_split, *config.eval_splits), scans=tuple(config.scans),
                      max_instruction_len=config.max_instruction_len, max_conns=config.max_conns,
                      max_steps=config.max_steps, reward=config.reward)

    def make_agent(self) -> Agent:
        data = self._data()
        vocab = Vocab.read(data.path(data.vocab_file))
        return VLNAgent(len(vocab), self.config.feature_dim, self.config.hidden_size, self.config.embedding_size,
                        pad_id=vocab.pad_id)

    @functools.cached_property
    def _eval_set(self) -> list[tuple[str, int]]:
        return [(split, i) for split in self.config.eval_splits for i in range(len(self._eval_scans[split]))]

    @functools.cached_property
    def _eval_scans(self) -> dict[str, dict[str, str]]:
        """Per eval split, each episode's instr_id and its scan, as the data holds them: what an
        actor's record is checked against before any file name or path is built from it."""
        data = self._data()
        return {split: {e.instr_id: e.scan for e in read_instructions(data.path(f"R2R_{split}.json"))}
                for split in self.config.eval_splits}

    def num_eval_episodes(self) -> int:
        """Every instruction of every eval split, once."""
        return len(self._eval_set)

    def eval_reset(self, episode: int) -> tuple[int, dict[str, Any] | None]:
        split, index = self._eval_set[episode]
        return self.config.eval_seed + episode, {"split": split, "index": index}

    def episode_metrics(self, final_info: Mapping[str, Any]) -> dict[str, float]:
        """The VLN metrics; an eval split's go under its name (eval/val_unseen/SR, ...)."""
        split = final_info["split"]
        prefix = "" if split == self.config.train_split else f"{split}/"
        return {prefix + name: float(value) for name, value in final_info["metrics"].items()}

    def episode_metric_names(self) -> tuple[str, ...]:
        return METRIC_NAMES

    def eval_metric_names(self) -> tuple[str, ...]:
        """Each eval split's metrics under its name; a goal-less split (test) reports its steps."""
        return tuple(f"{split}/{name}" for split in self.config.eval_splits if split != self.config.train_split
                     for name in (*METRIC_NAMES, "steps"))

    def eval_images(self, final_info: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """A top-down picture of each eval split's first episode, per round."""
        if final_info["split"] == self.config.train_split or final_info["index"] != 0:
            return {}
        graph = cached_scan_graph(self._data().path("connectivity"), final_info["scan"])
        picture = draw_episode(graph, final_info["reference"], final_info["trajectory"])
        return {f"{final_info['split']}/topdown": picture}

    def episode_record(self, final_info: Mapping[str, Any]) -> dict[str, Any]:
        record = {key: final_info[key] for key in ("instr_id", "split", "scan", "reference", "trajectory")}
        return {**record, "headings": [float(h) for h in final_info["headings"]],
                "elevations": [float(e) for e in final_info["elevations"]]}

    def learner_writes_eval_records(self) -> bool:
        return self.config.results_each_eval_round

    def check_episode_record(self, record: Mapping[str, Any]) -> None:
        """What write_eval_records reads: ids and viewpoints as strings, one finite heading
        and elevation per viewpoint of the trajectory, a split this run evaluates, and an
        instr_id and scan of that split's data."""
        for key in ("instr_id", "split", "scan"):
            if not isinstance(record.get(key), str):
                raise ValueError(f"record field {key!r} must be a string, got {record.get(key)!r:.80}")
        if record["split"] not in self.config.eval_splits:
            raise ValueError(f"record split {record['split']!r} is not one of eval_splits {self.config.eval_splits}")
        # File names and a read path are built from these: only the loaded data's own ids pass.
        scans = self._eval_scans[record["split"]]
        if record["instr_id"] not in scans:
            raise ValueError(f"record instr_id {record['instr_id']!r:.80} is not an episode of split {record['split']}")
        if record["scan"] != scans[record["instr_id"]]:
            raise ValueError(f"record scan {record['scan']!r:.80} is not the scan of episode {record['instr_id']} "
                             f"({scans[record['instr_id']]})")
        for key in ("reference", "trajectory"):
            value = record.get(key)
            if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                raise ValueError(f"record field {key!r} must be a non-empty list of viewpoint ids")
        length = len(record["trajectory"])
        for key in ("headings", "elevations"):
            value = record.get(key)
            if (not isinstance(value, list) or len(value) != length
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
                raise ValueError(f"record field {key!r} must hold one number per trajectory viewpoint ({length})")

    def write_eval_records(self, records: list[dict[str, Any]], output: str, suffix: str = "") -> list[str]:
        """R2R results files, `results_{split}{suffix}.json` ([{"instr_id", "trajectory":
        [[viewpoint, heading, elevation], ...]}], what R2R's scorers read, in R2R's heading
        convention), and a top-down picture of each split's first episode. A split without
        goals (test) gets its results file too, with a warning that its SR, SPL and the rest
        need the goals."""
        data = self._data()
        written = []
        os.makedirs(output, exist_ok=True)
        for split in sorted({r["split"] for r in records}):
            mine = [r for r in records if r["split"] == split]
            results = [{"instr_id": r["instr_id"],
                        "trajectory": [[v, h, e] for v, h, e in zip(r["trajectory"], r["headings"], r["elevations"])]}
                       for r in mine]
            if all(len(r["reference"]) == 1 for r in mine):
                log.warning("split %s has no goals (its paths hold only their start): its results file is written "
                            "and only PL and steps are reported; SR, SPL, nDTW and the rest need the goals (R2R's "
                            "evaluation server scores the file)", split)
            path = os.path.join(output, f"results_{split}{suffix}.json")
            atomic_write_json(path, results)  # a scorer watching the folder never reads half a file
            first = mine[0]
            graph = cached_scan_graph(data.path("connectivity"), first["scan"])
            picture = os.path.join(output, f"topdown_{split}_{first['instr_id']}{suffix}.png")
            Image.fromarray(draw_episode(graph, first["reference"], first["trajectory"])).save(picture)
            written += [path, picture]
        return written
