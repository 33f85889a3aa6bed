"""R2R readers on fleetrl's synthetic data and, when present, on real sample files; the env's oracle."""

import json
import os

import numpy as np
import pytest

from fleetrl.envs.r2r import DataError, R2RData, R2REnv, Vocab, load_scan_graph, read_instructions
from fleetrl.envs.r2r.features import load_features, read_tsv, write_tsv
from fleetrl.envs.r2r.graph import read_scans
from fleetrl.envs.r2r.instructions import check_paths
from fleetrl.envs.r2r.synthetic import SyntheticConfig, generate

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "r2r_sample")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("r2r"))
    counts = generate(SyntheticConfig(out=out, train_houses=4, unseen_houses=2, paths_per_train_house=6))
    return out, counts


def test_the_synthetic_dataset_is_complete_in_the_real_formats(synthetic):
    out, counts = synthetic
    scans = read_scans(os.path.join(out, "scans.txt"))
    assert len(scans) == 6 and all(len(s) == 11 for s in scans)
    assert all(counts[split] > 0 for split in ("train", "val_seen", "val_unseen"))
    splits = {split: read_instructions(os.path.join(out, f"R2R_{split}.json"))
              for split in ("train", "val_seen", "val_unseen")}
    graphs = {scan: load_scan_graph(os.path.join(out, "connectivity"), scan) for scan in scans}
    for split, episodes in splits.items():
        assert len(episodes) == counts[split]
        check_paths(episodes, graphs, split)
        for e in episodes:
            path_id, k = e.instr_id.split("_")
            assert int(k) in (0, 1, 2)
            # R2R paths are shortest paths.
            graph = graphs[e.scan]
            assert e.path[0] != e.path[-1]
            assert graph.shortest_path(e.path[0], e.path[-1]) == list(e.path)
    # val_unseen houses are new; val_seen's are train's.
    train_scans = {e.scan for e in splits["train"]}
    assert {e.scan for e in splits["val_seen"]} <= train_scans
    assert not {e.scan for e in splits["val_unseen"]} & train_scans
    with open(os.path.join(out, "R2R_train.json")) as f:
        entry = json.load(f)[0]
    assert set(entry) == {"distance", "scan", "path_id", "path", "heading", "instructions"}
    graph = graphs[entry["scan"]]
    assert entry["distance"] == pytest.approx(graph.distance(entry["path"][0], entry["path"][-1]), abs=0.01)
    # Every viewpoint has 36 feature rows, and the vocab covers every instruction word.
    features = load_features(os.path.join(out, "features.tsv"), 32)
    assert len(features.index) == sum(len(g.positions) for g in graphs.values())
    vocab = Vocab.read(os.path.join(out, "vocab.txt"))
    for e in splits["val_unseen"]:
        assert vocab.unk_id not in vocab.encode(e.instruction, 40)


def test_synthetic_generation_is_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        generate(SyntheticConfig(out=str(out), train_houses=2, unseen_houses=1, paths_per_train_house=3))
    for name in ("R2R_train.json", "R2R_val_unseen.json", "features.tsv", "vocab.txt"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_features_round_trip_through_the_tsv_and_the_cache(tmp_path):
    rng = np.random.default_rng(0)
    rows = {("scanA", "v1"): rng.standard_normal((36, 8)).astype(np.float32),
            ("scanA", "v2"): rng.standard_normal((36, 8)).astype(np.float32)}
    path = str(tmp_path / "f.tsv")
    write_tsv(path, rows)
    fields = open(path).readline().rstrip("\n").split("\t")
    assert fields[:5] == ["scanA", "v1", "640", "480", "60"]
    assert np.array_equal(read_tsv(path, 8)["scanA_v2"], rows[("scanA", "v2")])
    cached = load_features(path, 8)
    assert os.path.exists(path + ".cache.npy")
    assert np.array_equal(cached("scanA", "v1"), rows[("scanA", "v1")])
    assert np.array_equal(load_features(path, 8)("scanA", "v2"), rows[("scanA", "v2")])  # from the cache
    with pytest.raises(DataError, match="no features for scan scanA viewpoint v9"):
        cached("scanA", "v9")


def test_a_feature_row_of_the_wrong_size_names_its_line(tmp_path):
    path = str(tmp_path / "f.tsv")
    write_tsv(path, {("s", "v1"): np.zeros((36, 8)), ("s", "v2"): np.zeros((36, 7))})
    with pytest.raises(DataError, match=r"f.tsv:2: 'features' of s_v2 has 252 floats, expected 36 views x 8"):
        read_tsv(path, 8)


def test_missing_files_and_bad_paths_are_named(synthetic, tmp_path):
    out, _ = synthetic
    with pytest.raises(DataError, match="scan 'nope': no connectivity file .*nope_connectivity.json"):
        load_scan_graph(os.path.join(out, "connectivity"), "nope")
    with pytest.raises(DataError, match="no instruction file .*R2R_test.json"):
        read_instructions(os.path.join(out, "R2R_test.json"))
    broken = tmp_path / "R2R_bad.json"
    entries = json.load(open(os.path.join(out, "R2R_train.json")))[:2]
    entries[1]["path"][1] = "f" * 32
    broken.write_text(json.dumps(entries))
    scan = entries[1]["scan"]
    graphs = {scan: load_scan_graph(os.path.join(out, "connectivity"), scan),
              entries[0]["scan"]: load_scan_graph(os.path.join(out, "connectivity"), entries[0]["scan"])}
    with pytest.raises(DataError, match=f"passes viewpoint {'f' * 32}, which is not in the graph of scan {scan}"):
        check_paths(read_instructions(str(broken)), graphs, str(broken))
    with pytest.raises(DataError, match="needs scan 'other'"):
        check_paths([read_instructions(str(broken))[0].__class__("1_0", "other", ("a",), 0.0, "go")], graphs, "x")
    del entries[0]["heading"]
    broken.write_text(json.dumps(entries))
    with pytest.raises(DataError, match="entry 0 .* has no 'heading'"):
        read_instructions(str(broken))


def test_tokenization_maps_unknown_words_and_pads():
    vocab = Vocab(["<PAD>", "<UNK>", "<EOS>", "walk", "to", "the", "stairs", "."])
    ids = vocab.encode("Walk to the STAIRS, quickly.", 10)
    assert list(ids) == [3, 4, 5, 6, 1, 1, 7, 2, 0, 0]  # ',' and 'quickly' are unknown
    assert list(vocab.encode("walk to the stairs walk to the stairs", 4)) == [3, 4, 5, 2]  # cut, EOS kept
    with pytest.raises(DataError, match="no <UNK>"):
        Vocab(["<PAD>", "a"])


def test_the_oracle_always_follows_a_shortest_path(synthetic):
    out, _ = synthetic
    env = R2REnv(R2RData(out), splits=("train", "val_unseen"))
    for split in ("train", "val_unseen"):
        for index in range(len(env.episodes[split])):
            obs, _ = env.reset(options={"split": split, "index": index})
            done = False
            while not done:
                mask = obs["candidate_mask"].astype(bool)
                assert mask[obs["oracle_action"]]
                obs, reward, terminated, truncated, info = env.step(obs["oracle_action"])
                done = terminated or truncated
            episode = env.episodes[split][index]
            graph = env.graphs[episode.scan]
            assert terminated and info["trajectory"] == graph.shortest_path(episode.path[0], episode.path[-1])
            assert info["metrics"]["SR"] == 1.0 and info["metrics"]["SPL"] == pytest.approx(1.0)
            assert reward == 4.0  # stopped at the goal


def test_observations_rewards_and_the_step_cap(synthetic):
    out, _ = synthetic
    env = R2REnv(R2RData(out), max_steps=3)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert obs["candidates"][0].tolist() == [0.0] * 32 and obs["candidate_mask"][0] == 1
    n = int(obs["candidate_mask"].sum()) - 1
    assert n >= 1 and not obs["candidate_mask"][n + 1:].any()
    assert np.allclose(np.hypot(obs["candidate_angles"][1:n + 1, 0], obs["candidate_angles"][1:n + 1, 1]), 1.0)
    # Moving away from the goal costs up to 1 per step; the cap truncates with the -4 penalty.
    rewards, truncated = [], False
    while not truncated:
        wrong = next(s for s in range(1, int(obs["candidate_mask"].sum())) if s != obs["oracle_action"]) \
            if obs["candidate_mask"].sum() > 2 else int(obs["oracle_action"] or 1)
        goal_before = env.graph.distance(env.trajectory[-1], env.episode.path[-1])
        obs, reward, terminated, truncated, info = env.step(wrong)
        goal_after = env.graph.distance(env.trajectory[-1], env.episode.path[-1])
        rewards.append(reward)
    assert len(rewards) == 3 and not terminated
    assert rewards[-1] == pytest.approx(float(np.clip(goal_before - goal_after, -1, 1)) - 4.0)
    with pytest.raises(ValueError, match="not a valid slot"):
        env.reset(seed=1)
        env.step(13)


def test_dtw_rewards_sum_to_the_final_dtw(synthetic):
    out, _ = synthetic
    env = R2REnv(R2RData(out), reward="dtw")
    obs, _ = env.reset(seed=3)
    total = 0.0
    for _ in range(2):
        obs, reward, terminated, truncated, info = env.step(1)
        total += reward
    from fleetrl.envs.r2r.metrics import dtw
    start = env.episode.path[0]
    assert total == pytest.approx(dtw([start], env.episode.path, env.graph.distance)
                                  - dtw(env.trajectory, env.episode.path, env.graph.distance))


def test_an_actor_loads_only_its_shard_of_scans(synthetic):
    out, _ = synthetic
    scans = read_scans(os.path.join(out, "scans.txt"))
    env = R2REnv(R2RData(out), splits=("train",), scans=(scans[0],))
    assert set(env.graphs) == {scans[0]} and {e.scan for e in env.episodes["train"]} == {scans[0]}


@pytest.mark.skipif(not os.path.isdir(SAMPLE), reason="../shared/data/r2r_sample is only on development machines")
def test_the_readers_take_real_r2r_files(tmp_path):
    episodes = read_instructions(os.path.join(SAMPLE, "R2R_3scans.json"))
    assert len(episodes) >= 12 * 3 and episodes[0].instr_id.endswith("_0")
    graphs = {scan: load_scan_graph(os.path.join(SAMPLE, "connectivity"), scan) for scan in {e.scan for e in episodes}}
    check_paths(episodes, graphs, "sample")
    entries = json.load(open(os.path.join(SAMPLE, "R2R_3scans.json")))
    for entry in entries:
        graph = graphs[entry["scan"]]
        walked = sum(graph.distance(a, b) for a, b in zip(entry["path"][:-1], entry["path"][1:]))
        assert walked == pytest.approx(entry["distance"], abs=0.05)  # R2R's own path lengths
        for a, b in zip(entry["path"][:-1], entry["path"][1:]):
            assert b in graph.neighbours(a)
    vocab = Vocab.read(os.path.join(SAMPLE, "vocab.txt"))
    ids = vocab.encode(episodes[0].instruction, 80)
    words = ids[(ids != vocab.pad_id) & (ids != vocab.eos_id)]
    assert len(words) > 10 and (words == vocab.unk_id).mean() < 0.1  # VALAN's vocab covers its own data
