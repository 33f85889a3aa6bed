"""The VLN metrics on hand-made graphs, against values worked out by hand."""

import math

import networkx as nx
import numpy as np
import pytest

from fleetrl.envs.r2r.graph import ScanGraph
from fleetrl.envs.r2r.metrics import cls, collapse_repeats, dtw, episode_metrics, ndtw


def line_graph(spacing=2.0):
    """a - b - c - d - e on a straight line, `spacing` metres apart, plus a detour b - x - d
    of 3 + 3 metres (longer than b - c - d)."""
    names = "abcde"
    positions = {n: np.array([i * spacing, 0.0, 0.0]) for i, n in enumerate(names)}
    positions["x"] = np.array([2 * spacing, 2.0, 0.0])
    graph = nx.Graph()
    for u, v in zip(names[:-1], names[1:]):
        graph.add_edge(u, v, weight=spacing)
    graph.add_edge("b", "x", weight=3.0)
    graph.add_edge("x", "d", weight=3.0)
    return ScanGraph("line", graph, positions)


@pytest.fixture
def graph():
    return line_graph()


def test_the_perfect_episode(graph):
    m = episode_metrics(list("abcd"), list("abcd"), graph.distance)
    assert m == {"PL": 6.0, "NE": 0.0, "SR": 1.0, "OSR": 1.0, "SPL": 1.0, "CLS": 1.0, "nDTW": 1.0, "SDTW": 1.0}


def test_stopping_one_node_short_is_within_three_metres(graph):
    m = episode_metrics(list("abc"), list("abcd"), graph.distance)
    assert m["PL"] == 4.0 and m["NE"] == 2.0 and m["SR"] == 1.0
    assert m["SPL"] == pytest.approx(1.0)  # 1 * 6 / max(4, 6)
    # DTW: a-a 0, b-b 0, c-c 0, then d matched to c: 2; nDTW = exp(-2 / (4 * 3)).
    assert m["nDTW"] == pytest.approx(math.exp(-2 / 12))
    # Coverage: a, b, c exactly, d at 2 m: (3 + e^(-2/3)) / 4; EPL = PC * 6; LS = EPL / (EPL + |EPL - 4|).
    pc = (3 + math.exp(-2 / 3)) / 4
    epl = pc * 6
    assert m["CLS"] == pytest.approx(pc * epl / (epl + abs(epl - 4)))


def test_a_path_of_length_zero(graph):
    m = episode_metrics(["a"], list("abcd"), graph.distance)
    assert m["PL"] == 0.0 and m["NE"] == 6.0 and m["SR"] == 0.0 and m["OSR"] == 0.0 and m["SPL"] == 0.0
    # DTW: the single a matches every reference node: 0 + 2 + 4 + 6.
    assert m["nDTW"] == pytest.approx(math.exp(-12 / 12))
    # Both lengths zero: VALAN scores CLS 1.
    assert cls(["a"], ["a"], graph.distance) == 1.0
    assert episode_metrics(["a"], ["a"], graph.distance)["SPL"] == 1.0


def test_repeated_viewpoints_are_collapsed(graph):
    assert collapse_repeats(list("aabbbcbb")) == list("abcb")
    assert episode_metrics(list("aabbccdd"), list("abcd"), graph.distance) == \
        episode_metrics(list("abcd"), list("abcd"), graph.distance)


def test_a_reference_path_that_is_not_the_shortest(graph):
    """R = b-x-d (6 m) while b-c-d is 4 m: SPL uses the shortest distance, not |R|."""
    m = episode_metrics(list("bxd"), list("bxd"), graph.distance)
    assert m["PL"] == 6.0 and m["SR"] == 1.0
    assert m["SPL"] == pytest.approx(4 / 6)
    assert m["nDTW"] == 1.0 and m["CLS"] == 1.0
    shortcut = episode_metrics(list("bcd"), list("bxd"), graph.distance)
    assert shortcut["SPL"] == 1.0  # the shortest path is perfectly efficient...
    # ...but strays from R: c is 5 m from x by the graph (c-b-x or c-d-x).
    assert graph.distance("c", "x") == 5.0
    assert shortcut["nDTW"] == pytest.approx(math.exp(-5 / 9))
    assert shortcut["CLS"] < 1.0


def test_overshooting_fails_but_counts_as_oracle_success(graph):
    m = episode_metrics(list("abcde"), list("abc"), graph.distance)
    assert m["NE"] == 4.0 and m["SR"] == 0.0 and m["OSR"] == 1.0 and m["SDTW"] == 0.0
    assert m["SPL"] == 0.0


def test_dtw_against_a_naive_recursion(graph):
    """The DP table against the definition, on random walks."""
    rng = np.random.default_rng(0)
    nodes = list(graph.positions)

    def naive(p, r):
        if not p and not r:
            return 0.0
        if not p or not r:
            return math.inf
        return graph.distance(p[-1], r[-1]) + min(naive(p[:-1], r), naive(p, r[:-1]), naive(p[:-1], r[:-1]))

    for _ in range(20):
        p = list(rng.choice(nodes, size=rng.integers(1, 5)))
        r = list(rng.choice(nodes, size=rng.integers(1, 5)))
        assert dtw(p, r, graph.distance) == pytest.approx(naive(p, r))
        assert 0 < ndtw(p, r, graph.distance) <= 1


def test_empty_paths_are_refused(graph):
    with pytest.raises(ValueError, match="non-empty"):
        episode_metrics([], ["a"], graph.distance)
