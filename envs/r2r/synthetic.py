"""A synthetic Room-to-Room dataset in the real formats, so fleetrl runs without Matterport data.

    python -m fleetrl.launch.r2r_synthetic --out=data/r2r_synthetic

Each house is a jittered grid of viewpoints 4 m apart (more than the 3 m success radius,
so success means stopping at the goal), with some walls removed and some added. Each
viewpoint holds one landmark ("the red room", "the stairs", ...). A path is the shortest
path between two viewpoints 2-4 hops apart, and its instructions name the landmark of every
viewpoint it passes, in order, ending with the goal's ("walk to the kitchen, then go past
the red room and stop at the stairs."). Paths are only kept where each named landmark is
the only one of its kind among the neighbours the agent chooses from, so an instruction
always determines its path.

Features are honest about what an agent could see: a view facing a neighbour shows that
neighbour's landmark, every view shows a little of the current viewpoint's own, and all
views carry Gaussian noise. A landmark's appearance is one fixed random vector shared by
every house, so words can be grounded in features, and val_unseen (new houses) tests
exactly that. Without the instruction an agent can only guess.

Writes: connectivity/{scan}_connectivity.json, scans.txt, R2R_{train,val_seen,val_unseen}.json,
vocab.txt, and features.tsv (36 views x `dim`, base64 float32).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import networkx as nx
import numpy as np

from fleetrl.envs.r2r.features import VIEWS, write_tsv
from fleetrl.envs.r2r.vocab import EOS, PAD, UNK, Vocab

LANDMARKS = ("red room", "blue room", "green room", "yellow room", "kitchen", "bathroom", "bedroom",
             "stairs", "fireplace", "piano", "sofa", "mirror", "plant", "bookshelf")
TEMPLATES = (
    ("walk to the {}", "then go past the {}", "and stop at the {}."),
    ("head towards the {}", "continue to the {}", "and wait by the {}."),
    ("go to the {}", "walk through the {}", "then stop next to the {}."),
)
SPLITS = ("train", "val_seen", "val_unseen")


@dataclasses.dataclass
class SyntheticConfig:
    out: str = "data/r2r_synthetic"
    train_houses: int = 24
    unseen_houses: int = 6
    grid: int = 4  # viewpoints per side
    spacing_m: float = 4.0
    paths_per_train_house: int = 40
    paths_per_val_house: int = 2
    dim: int = 32  # feature width
    noise: float = 0.3
    seed: int = 0


def _hex(rng: np.random.Generator, n: int) -> str:
    return "".join("0123456789abcdef"[i] for i in rng.integers(16, size=n))


def _scan_id(rng: np.random.Generator) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(alphabet[i] for i in rng.integers(len(alphabet), size=11))


def _house(rng: np.random.Generator, config: SyntheticConfig):
    """Viewpoint ids, positions [N, 3], an adjacency set and landmarks: one connected house."""
    n = config.grid
    ids = [_hex(rng, 32) for _ in range(n * n)]
    jitter = rng.uniform(-0.3, 0.3, size=(n * n, 2))
    positions = np.array([[(i % n) * config.spacing_m + jitter[i, 0], (i // n) * config.spacing_m + jitter[i, 1], 1.5]
                          for i in range(n * n)])
    grid_edges = [(i, i + 1) for i in range(n * n) if i % n < n - 1] + [(i, i + n) for i in range(n * n - n)]
    # A random spanning tree keeps the house connected; a third of the other walls are open too.
    order = rng.permutation(len(grid_edges))
    parent = list(range(n * n))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    edges = set()
    for k in order:
        a, b = grid_edges[k]
        if root(a) != root(b):
            parent[root(a)] = root(b)
            edges.add((a, b))
        elif rng.random() < 0.33:
            edges.add((a, b))
    landmarks = [int(x) for x in rng.integers(len(LANDMARKS), size=n * n)]
    return ids, positions, edges, landmarks


def _connectivity(ids, positions, edges) -> list[dict]:
    n = len(ids)
    open_ = np.zeros((n, n), bool)
    for a, b in edges:
        open_[a, b] = open_[b, a] = True
    entries = []
    for i in range(n):
        pose = np.eye(4)
        pose[:3, 3] = positions[i]
        entries.append({"image_id": ids[i], "pose": [float(x) for x in pose.reshape(-1)], "included": True,
                        "visible": [bool(x) for x in open_[i]], "unobstructed": [bool(x) for x in open_[i]],
                        "height": 1.5})
    return entries


def _view_features(rng, positions, edges, landmarks, appearance, config) -> np.ndarray:
    """[N, 36, dim]: views facing a neighbour show its landmark; all show a little of their own."""
    n = len(positions)
    features = 0.5 * appearance[landmarks][:, None, :] + config.noise * rng.standard_normal((n, VIEWS, config.dim))
    for a, b in edges:
        for here, there in ((a, b), (b, a)):
            dx, dy = positions[there][:2] - positions[here][:2]
            heading = math.atan2(dx, dy) % (2 * math.pi)
            view = 12 + int(round(heading / (math.pi / 6))) % 12  # the level row
            features[here, view] += appearance[landmarks[there]]
    return features.astype(np.float32)


def _paths(rng, ids, positions, edges, landmarks, count, used, scan):
    """Up to `count` unambiguous shortest paths of 2-4 hops not in `used`, as R2R entries."""
    graph = nx.Graph()
    for a, b in edges:
        graph.add_edge(a, b, weight=float(np.linalg.norm(positions[a] - positions[b])))
    lengths = dict(nx.all_pairs_shortest_path_length(graph))  # hops
    entries, attempts = [], 0
    while len(entries) < count and attempts < 200 * count:
        attempts += 1
        start, goal = (int(x) for x in rng.integers(len(ids), size=2))
        if not 2 <= lengths[start].get(goal, 0) <= 4 or (start, goal) in used:
            continue
        path = nx.shortest_path(graph, start, goal, weight="weight")  # metres, as R2R's paths
        # Each next landmark must be unique among the current viewpoint's neighbours.
        if any([landmarks[m] for m in graph.neighbors(here)].count(landmarks[nxt]) > 1
               for here, nxt in zip(path[:-1], path[1:])):
            continue
        used.add((start, goal))
        names = [LANDMARKS[landmarks[i]] for i in path[1:]]
        instructions = []
        for first, middle, last in TEMPLATES:
            parts = [first.format(names[0])] + [middle.format(x) for x in names[1:-1]] + [last.format(names[-1])]
            instructions.append(", ".join(parts[:-1]) + " " + parts[-1])
        distance = sum(float(np.linalg.norm(positions[a] - positions[b])) for a, b in zip(path[:-1], path[1:]))
        entries.append({"distance": round(distance, 2), "scan": scan, "path_id": 0,
                        "path": [ids[i] for i in path], "heading": float(rng.uniform(0, 2 * math.pi)),
                        "instructions": instructions})
    return entries


def generate(config: SyntheticConfig) -> dict[str, int]:
    """Writes the dataset to config.out; returns the number of instructions per split."""
    rng = np.random.default_rng(config.seed)
    appearance = rng.standard_normal((len(LANDMARKS), config.dim)).astype(np.float32)
    appearance /= np.linalg.norm(appearance, axis=1, keepdims=True) / math.sqrt(config.dim) * 2
    os.makedirs(os.path.join(config.out, "connectivity"), exist_ok=True)
    splits: dict[str, list[dict]] = {split: [] for split in SPLITS}
    features: dict[tuple[str, str], np.ndarray] = {}
    scans = []
    for h in range(config.train_houses + config.unseen_houses):
        scan = _scan_id(rng)
        scans.append(scan)
        ids, positions, edges, landmarks = _house(rng, config)
        with open(os.path.join(config.out, "connectivity", f"{scan}_connectivity.json"), "w") as f:
            json.dump(_connectivity(ids, positions, edges), f)
        for i, array in enumerate(_view_features(rng, positions, edges, landmarks, appearance, config)):
            features[(scan, ids[i])] = array
        used: set = set()
        if h < config.train_houses:
            splits["train"] += _paths(rng, ids, positions, edges, landmarks, config.paths_per_train_house, used, scan)
            splits["val_seen"] += _paths(rng, ids, positions, edges, landmarks, config.paths_per_val_house, used, scan)
        else:
            splits["val_unseen"] += _paths(rng, ids, positions, edges, landmarks, config.paths_per_val_house * 4, used,
                                           scan)
    path_id = 0
    words = set()
    for split in SPLITS:
        for entry in splits[split]:
            entry["path_id"] = path_id
            path_id += 1
            for text in entry["instructions"]:
                words.update(Vocab.split(text))
        with open(os.path.join(config.out, f"R2R_{split}.json"), "w") as f:
            json.dump(splits[split], f, indent=1)
    with open(os.path.join(config.out, "scans.txt"), "w") as f:
        f.write("\n".join(scans) + "\n")
    Vocab([PAD, UNK, EOS] + sorted(words)).write(os.path.join(config.out, "vocab.txt"))
    write_tsv(os.path.join(config.out, "features.tsv"), features)
    return {split: sum(len(e["instructions"]) for e in splits[split]) for split in SPLITS}
