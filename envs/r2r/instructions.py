"""R2R instruction files (`R2R_{split}.json`) as episodes, one per instruction.

An episode's id is `{path_id}_{k}`, the id R2R's results files and scorers use.
"""

from __future__ import annotations

import dataclasses

from fleetrl.envs.r2r.graph import DataError, ScanGraph, read_json

_REQUIRED = ("scan", "path_id", "path", "heading", "instructions")


@dataclasses.dataclass(frozen=True)
class Episode:
    instr_id: str
    scan: str
    path: tuple[str, ...]
    heading: float
    instruction: str


def read_instructions(path: str) -> list[Episode]:
    entries = read_json(path, f"no instruction file {path}")
    episodes = []
    for i, entry in enumerate(entries):
        for field in _REQUIRED:
            if field not in entry:
                raise DataError(f"{path}: entry {i} (path_id {entry.get('path_id')}) has no {field!r}")
        if not entry["path"]:
            raise DataError(f"{path}: path_id {entry['path_id']} has an empty 'path'")
        for k, text in enumerate(entry["instructions"]):
            episodes.append(Episode(f"{entry['path_id']}_{k}", entry["scan"], tuple(entry["path"]),
                                    float(entry["heading"]), text))
    return episodes


def check_paths(episodes: list[Episode], graphs: dict[str, ScanGraph], source: str) -> None:
    """Every path's scan is loaded and every viewpoint on it is in that scan's graph."""
    for episode in episodes:
        graph = graphs.get(episode.scan)
        if graph is None:
            raise DataError(f"{source}: episode {episode.instr_id} needs scan {episode.scan!r}, which is not loaded")
        for viewpoint in episode.path:
            if viewpoint not in graph:
                raise DataError(f"{source}: episode {episode.instr_id} 'path' passes viewpoint {viewpoint}, "
                                f"which is not in the graph of scan {episode.scan}")
