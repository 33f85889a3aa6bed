"""A top-down picture of one episode: the scan's graph, the reference path and the agent's."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

from fleetrl.envs.r2r.graph import ScanGraph

GREY, GREEN, RED, BLUE = (170, 170, 170), (30, 160, 60), (210, 40, 40), (40, 70, 200)


def draw_episode(graph: ScanGraph, reference: Sequence[str], trajectory: Sequence[str], size: int = 256) -> np.ndarray:
    """[size, size, 3] uint8: edges in grey, the reference path in green (start in blue), the
    agent's path in red, its last viewpoint ringed."""
    xy = {v: p[:2] for v, p in graph.positions.items()}
    points = np.array(list(xy.values()))
    low, high = points.min(0), points.max(0)
    scale = (size - 24) / max(float((high - low).max()), 1e-6)

    def pixel(v: str) -> tuple[float, float]:
        x, y = (xy[v] - low) * scale + 12
        return float(x), float(size - y)  # +y is up in the house, down in the image

    image = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for a, b in graph.graph.edges:
        draw.line([pixel(a), pixel(b)], fill=GREY, width=1)
    for v in xy:
        x, y = pixel(v)
        draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=GREY)
    for path, colour, width in ((reference, GREEN, 5), (trajectory, RED, 2)):
        if len(path) > 1:
            draw.line([pixel(v) for v in path], fill=colour, width=width, joint="curve")
    x, y = pixel(reference[0])
    draw.ellipse([x - 5, y - 5, x + 5, y + 5], fill=BLUE)
    x, y = pixel(trajectory[-1])
    draw.ellipse([x - 7, y - 7, x + 7, y + 7], outline=RED, width=2)
    return np.asarray(image)
