"""Panoramic image features: R2R's TSV (36 views x D, base64 float32) and a fast cache.

The TSV's fields are scanId, viewpointId, image_w, image_h, vfov, features. Reading it
means decoding base64 for every row, so `load_features` builds a cache beside it once: one
[N, 36, D] float32 `.npy` (memory-mapped, so actor processes share the pages) and a JSON
index of its rows, keyed `{scan}_{viewpoint}` as the TSV readers of R2R key them.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import sys

import numpy as np

from fleetrl.common.files import atomic_write, atomic_write_json
from fleetrl.envs.r2r.graph import DataError

VIEWS = 36
TSV_FIELDS = ("scanId", "viewpointId", "image_w", "image_h", "vfov", "features")


def write_tsv(path: str, features: dict[tuple[str, str], np.ndarray]) -> None:
    """Writes {(scan, viewpoint): [36, D] array} in the R2R TSV format."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        for (scan, viewpoint), array in features.items():
            data = base64.b64encode(np.ascontiguousarray(array, dtype=np.float32).tobytes()).decode("ascii")
            writer.writerow([scan, viewpoint, 640, 480, 60, data])


def read_tsv(path: str, dim: int) -> dict[str, np.ndarray]:
    """{"{scan}_{viewpoint}": [36, dim] float32}; a row of the wrong size names its line."""
    if not os.path.exists(path):
        raise DataError(f"no feature file {path}")
    csv.field_size_limit(sys.maxsize)
    rows = {}
    with open(path, newline="") as f:
        for line, row in enumerate(csv.reader(f, delimiter="\t"), 1):
            if len(row) != len(TSV_FIELDS):
                raise DataError(f"{path}:{line}: {len(row)} fields, expected {len(TSV_FIELDS)} {TSV_FIELDS}")
            try:
                data = np.frombuffer(base64.b64decode(row[5]), dtype=np.float32)
            except ValueError as e:
                raise DataError(f"{path}:{line}: 'features' is not base64 float32: {e}") from e
            if data.size != VIEWS * dim:
                raise DataError(f"{path}:{line}: 'features' of {row[0]}_{row[1]} has {data.size} floats, "
                                f"expected {VIEWS} views x {dim} = {VIEWS * dim}")
            rows[f"{row[0]}_{row[1]}"] = data.reshape(VIEWS, dim)
    return rows


class Features:
    """Lookup of [36, D] features by (scan, viewpoint), backed by the memory-mapped cache."""

    def __init__(self, array: np.ndarray, index: dict[str, int], source: str):
        self.array, self.index, self.source = array, index, source
        self.dim = array.shape[-1]

    def __call__(self, scan: str, viewpoint: str) -> np.ndarray:
        row = self.index.get(f"{scan}_{viewpoint}")
        if row is None:
            raise DataError(f"{self.source}: no features for scan {scan} viewpoint {viewpoint}")
        return self.array[row]


def load_features(tsv_path: str, dim: int) -> Features:
    """The features of `tsv_path`, through its cache (`<tsv>.cache.npy` and `.json`), built
    on first use and rebuilt when the TSV is newer."""
    cache, index_path = tsv_path + ".cache.npy", tsv_path + ".cache.json"
    if not os.path.exists(tsv_path):
        raise DataError(f"no feature file {tsv_path}")
    fresh = (os.path.exists(cache) and os.path.exists(index_path)
             and os.path.getmtime(cache) >= os.path.getmtime(tsv_path))
    if not fresh:
        rows = read_tsv(tsv_path, dim)
        keys = sorted(rows)
        array = np.stack([rows[k] for k in keys]) if keys else np.zeros((0, VIEWS, dim), np.float32)
        # Atomic, so concurrent actors never read half a cache.
        atomic_write(cache, lambda f: np.save(f, array))
        atomic_write_json(index_path, {k: i for i, k in enumerate(keys)})
    array = np.load(cache, mmap_mode="r")
    if array.shape[1:] != (VIEWS, dim):
        raise DataError(f"{cache}: features of shape {array.shape[1:]}, expected ({VIEWS}, {dim})")
    with open(index_path) as f:
        return Features(array, json.load(f), tsv_path)
