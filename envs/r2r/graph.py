"""Matterport connectivity graphs: `connectivity/{scan}_connectivity.json` as weighted graphs.

Nodes are the included viewpoints, edges join unobstructed pairs, weighted by 3-D distance
(the R2R reference). All-pairs shortest paths are computed once per scan and cached.
"""

from __future__ import annotations

import functools
import json
import math
import os

import networkx as nx
import numpy as np


class DataError(ValueError):
    """A data file is missing or malformed; the message names the file and the field."""


def read_json(path: str, missing: str) -> object:
    """The parsed file; `missing` is the message when it does not exist."""
    if not os.path.exists(path):
        raise DataError(missing)
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON: {e}") from e


class ScanGraph:
    """One scan: the graph, viewpoint positions, and shortest paths between every pair."""

    def __init__(self, scan: str, graph: nx.Graph, positions: dict[str, np.ndarray]):
        self.scan = scan
        self.graph = graph
        self.positions = positions
        self._paths: dict[str, dict[str, list[str]]] = {}
        self._distances: dict[str, dict[str, float]] = {}
        for source, (distances, paths) in nx.all_pairs_dijkstra(graph, weight="weight"):
            self._distances[source], self._paths[source] = distances, paths

    def __contains__(self, viewpoint: str) -> bool:
        return viewpoint in self.positions

    def distance(self, a: str, b: str) -> float:
        """Shortest-path metres; inf between disconnected viewpoints."""
        return self._distances[a].get(b, math.inf)

    def shortest_path(self, a: str, b: str) -> list[str]:
        return self._paths[a][b]

    def neighbours(self, viewpoint: str) -> list[str]:
        return list(self.graph.neighbors(viewpoint))

    def heading(self, a: str, b: str) -> float:
        """Heading from a to b in R2R's convention: radians in [0, 2π), 0 facing +y, turning
        clockwise (seen from above: +x is π/2)."""
        dx, dy = self.positions[b][:2] - self.positions[a][:2]
        return math.atan2(dx, dy) % (2 * math.pi)

    def elevation(self, a: str, b: str) -> float:
        delta = self.positions[b] - self.positions[a]
        return math.atan2(delta[2], math.hypot(delta[0], delta[1]))


def load_scan_graph(connectivity_dir: str, scan: str) -> ScanGraph:
    if not scan or os.sep in scan or (os.altsep and os.altsep in scan) or scan.startswith("."):
        raise DataError(f"scan {scan!r:.80} is not a scan id (a name, without a path)")
    path = os.path.join(connectivity_dir, f"{scan}_connectivity.json")
    entries = read_json(path, f"scan {scan!r}: no connectivity file {path}")
    graph = nx.Graph()
    positions: dict[str, np.ndarray] = {}
    for i, entry in enumerate(entries):
        for field in ("image_id", "pose", "included", "unobstructed"):
            if field not in entry:
                raise DataError(f"{path}: entry {i} has no {field!r}")
        if len(entry["unobstructed"]) != len(entries):
            raise DataError(f"{path}: entry {i} 'unobstructed' has {len(entry['unobstructed'])} values, "
                            f"expected one per entry ({len(entries)})")
        if len(entry["pose"]) != 16:
            raise DataError(f"{path}: entry {i} 'pose' has {len(entry['pose'])} values, expected 16")
        if entry["included"]:
            pose = entry["pose"]
            positions[entry["image_id"]] = np.array([pose[3], pose[7], pose[11]], dtype=np.float64)
    for i, entry in enumerate(entries):
        if not entry["included"]:
            continue
        for j, open_ in enumerate(entry["unobstructed"]):
            other = entries[j]
            if open_ and other["included"] and j != i:
                a, b = entry["image_id"], other["image_id"]
                graph.add_edge(a, b, weight=float(np.linalg.norm(positions[a] - positions[b])))
    # Included viewpoints without edges are unreachable: R2R drops them.
    positions = {v: p for v, p in positions.items() if v in graph}
    return ScanGraph(scan, graph, positions)


@functools.cache
def cached_scan_graph(connectivity_dir: str, scan: str) -> ScanGraph:
    return load_scan_graph(connectivity_dir, scan)


def read_scans(path: str) -> list[str]:
    """scans.txt: one scan id per line."""
    if not os.path.exists(path):
        raise DataError(f"no scans file {path}")
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]
