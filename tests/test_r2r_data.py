"""R2R readers on fleetrl's synthetic data and, when present, on real sample files; the env's oracle."""

import json
import os
import shutil

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
    poses = {scan: {v["image_id"]: v["pose"] for v in json.load(open(os.path.join(SAMPLE, "connectivity",
                                                                                  f"{scan}_connectivity.json")))}
             for scan in graphs}
    for entry in entries:
        graph = graphs[entry["scan"]]
        walked = sum(graph.distance(a, b) for a, b in zip(entry["path"][:-1], entry["path"][1:]))
        assert walked == pytest.approx(entry["distance"], abs=0.05)  # R2R's own path lengths
        for a, b in zip(entry["path"][:-1], entry["path"][1:]):
            assert b in graph.neighbours(a)
            # R2R's headings on real poses: [0, 2π), 0 facing +y and turning clockwise (toward
            # +x), read here straight from the poses' translations; the way back faces the other way.
            pose_a, pose_b = poses[entry["scan"]][a], poses[entry["scan"]][b]
            known = np.arctan2(pose_b[3] - pose_a[3], pose_b[7] - pose_a[7]) % (2 * np.pi)
            assert graph.heading(a, b) == pytest.approx(known, abs=1e-9) and 0 <= graph.heading(a, b) < 2 * np.pi
            assert graph.heading(b, a) == pytest.approx((graph.heading(a, b) + np.pi) % (2 * np.pi), abs=1e-9)
    vocab = Vocab.read(os.path.join(SAMPLE, "vocab.txt"))
    ids = vocab.encode(episodes[0].instruction, 80)
    words = ids[(ids != vocab.pad_id) & (ids != vocab.eos_id)]
    assert len(words) > 10 and (words == vocab.unk_id).mean() < 0.1  # VALAN's vocab covers its own data


def write_cross_scan(directory, scan="cross"):
    """A viewpoint with a neighbour 2 m to the north, east, south and west; the west one
    1.5 m higher up."""
    positions = {"center": (0, 0, 0), "north": (0, 2, 0), "east": (2, 0, 0), "south": (0, -2, 0), "west": (-2, 0, 1.5)}
    entries = []
    for i, (name, (x, y, z)) in enumerate(positions.items()):
        pose = [1, 0, 0, x, 0, 1, 0, y, 0, 0, 1, z, 0, 0, 0, 1]
        entries.append({"image_id": name, "pose": pose, "included": True,
                        "unobstructed": [j != i and (i == 0 or j == 0) for j in range(len(positions))]})
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{scan}_connectivity.json"), "w") as f:
        json.dump(entries, f)
    return load_scan_graph(directory, scan)


def test_headings_follow_r2rs_convention_zero_north_clockwise_in_zero_to_two_pi(tmp_path):
    graph = write_cross_scan(str(tmp_path))
    headings = {v: graph.heading("center", v) for v in ("north", "east", "south", "west")}
    assert headings == pytest.approx({"north": 0.0, "east": np.pi / 2, "south": np.pi, "west": 3 * np.pi / 2})
    assert graph.heading("west", "center") == pytest.approx(np.pi / 2)
    from fleetrl.envs.r2r.env import view_elevation
    # 1.5 m up over 2 m is 37 degrees: the agent looks through the +30 degree row of views.
    assert view_elevation(graph.elevation("center", "west")) == pytest.approx(np.pi / 6)
    assert view_elevation(graph.elevation("west", "center")) == pytest.approx(-np.pi / 6)
    assert view_elevation(graph.elevation("center", "north")) == 0.0


def goal_less_copy(synthetic, tmp_path, split="test"):
    """The synthetic dataset plus a split shaped like R2R's test split: paths of their start only."""
    out, _ = synthetic
    copy = tmp_path / "data"
    shutil.copytree(out, copy)
    entries = json.load(open(copy / "R2R_val_unseen.json"))
    for entry in entries:
        entry["path"] = entry["path"][:1]
        entry.pop("distance", None)
    json.dump(entries, open(copy / f"R2R_{split}.json", "w"))
    return str(copy)


def test_a_split_without_goals_pays_nothing_and_reports_only_path_length_and_steps(synthetic, tmp_path):
    env = R2REnv(R2RData(goal_less_copy(synthetic, tmp_path)), splits=("test",), max_steps=3)
    obs, _ = env.reset(options={"split": "test", "index": 0})
    rewards, done = [], False
    while not done:
        obs, reward, terminated, truncated, info = env.step(1)
        rewards.append(reward)
        done = terminated or truncated
    assert rewards == [0.0] * 3
    assert set(info["metrics"]) == {"PL", "steps"} and info["metrics"]["steps"] == 3
    assert info["metrics"]["PL"] > 0 and len(info["headings"]) == len(info["elevations"]) == 4
    assert all(0 <= h < 2 * np.pi for h in info["headings"])


def test_results_files_carry_r2r_headings_and_view_elevations_and_a_goal_less_split_says_why(
        synthetic, tmp_path, caplog):
    from fleetrl.problems.registry import load_problem
    problem = load_problem("r2r", {"data_dir": goal_less_copy(synthetic, tmp_path), "eval_splits": "[test,val_unseen]",
                                   "max_steps": "4"})
    env = problem.make_env()
    records = []
    for split in ("test", "val_unseen"):
        obs, _ = env.reset(options={"split": split, "index": 0})
        done = False
        while not done:
            obs, _, terminated, truncated, info = env.step(obs["oracle_action"] if split != "test" else 1)
            done = terminated or truncated
        records.append(problem.episode_record(info))
    with caplog.at_level("WARNING"):
        written = problem.write_eval_records(records, str(tmp_path / "out"))
    assert "split test has no goals" in caplog.text and "val_unseen" not in caplog.text
    for split, record in zip(("test", "val_unseen"), records):
        (result,) = json.load(open(tmp_path / "out" / f"results_{split}.json"))
        assert str(tmp_path / "out" / f"results_{split}.json") in written
        assert [step[0] for step in result["trajectory"]] == record["trajectory"]
        for (_, heading, elevation), (a, b) in zip(result["trajectory"][1:],
                                                           zip(record["trajectory"], record["trajectory"][1:])):
            graph = env.graphs[record["scan"]]
            assert heading == pytest.approx(graph.heading(a, b)) and 0 <= heading < 2 * np.pi
            assert elevation in (-np.pi / 6, 0.0, np.pi / 6)
        assert result["trajectory"][0][2] == 0.0


def test_the_learners_eval_rounds_write_r2r_results_files_named_by_policy_version(synthetic, tmp_path, serve):
    """Eval actors send each episode's trajectory as a record; the learner writes every round
    as R2R results files, the goal-less test split included."""
    import threading
    import time

    from fleetrl.actor.actor import Actor, ActorError
    from fleetrl.actor.config import ActorConfig

    data = goal_less_copy(synthetic, tmp_path)
    learner = serve(problem="r2r", hparams={"data_dir": data, "eval_splits": "[test,val_unseen]", "max_steps": "4"},
                    eval_interval_s=1.0)
    eval_actor = Actor(ActorConfig(learner_address=learner.address, mode="eval", num_envs=8, max_reconnect_s=5))

    def play():
        try:
            eval_actor.run()
        except ActorError:  # the learner stopped before it could say so: fine once the test is over
            pass

    actor = threading.Thread(target=play, daemon=True)
    actor.start()
    log = os.path.join(learner.config.logdir, "eval.jsonl")
    deadline = time.monotonic() + 120
    while not os.path.exists(log) and time.monotonic() < deadline:
        time.sleep(0.2)
    first_round = json.loads(open(log).readline())
    version = first_round["policy_version"]
    records = os.path.join(learner.config.logdir, "eval_records")
    for split in ("test", "val_unseen"):
        path = os.path.join(records, f"results_{split}_{version}.json")
        while not os.path.exists(path) and time.monotonic() < deadline:  # written just after eval.jsonl
            time.sleep(0.1)
        results = json.load(open(path))
        instructions = read_instructions(os.path.join(data, f"R2R_{split}.json"))
        assert sorted(r["instr_id"] for r in results) == sorted(e.instr_id for e in instructions)
        starts = {e.instr_id: e.path[0] for e in instructions}
        for result in results:
            assert result["trajectory"][0][0] == starts[result["instr_id"]]
            assert 1 <= len(result["trajectory"]) <= 5  # the start and at most max_steps moves
            assert all(len(step) == 3 and 0 <= step[1] < 2 * np.pi for step in result["trajectory"])
    assert set(first_round) >= {"test/PL", "test/steps", "val_unseen/SR"} and "test/SR" not in first_round
    learner.finish("test over")
    actor.join(timeout=30)
    assert not actor.is_alive()


def test_the_learner_refuses_episode_records_that_are_malformed_or_not_asked_for(synthetic, tmp_path, serve):
    from fleetrl.proto import learner_pb2 as pb
    from fleetrl.proto.episode_records import MAX_RECORD_BYTES
    from fleetrl.proto.tensors import WireError

    out, _ = synthetic
    learner = serve(problem="r2r", hparams={"data_dir": out, "max_steps": "4"})
    from fleetrl.envs.r2r import read_instructions

    episode = read_instructions(os.path.join(out, "R2R_val_unseen.json"))[0]
    good = {"instr_id": episode.instr_id, "split": "val_unseen", "scan": episode.scan, "reference": ["a", "b"],
            "trajectory": ["a", "c"], "headings": [0.5, 1.0], "elevations": [0.0, 0.0]}

    def decode(record: bytes, eval_episode: int | None = 3, service=learner.service):
        return service.intake.decoder.decode_episode(
            pb.EpisodeStats(env_index=0, eval_episode=eval_episode, record=record), 8)

    assert decode(json.dumps(good).encode()).record == good
    cases = [(json.dumps(good).encode(), None, "records come only with eval episodes"),
             (b"\xff{", 3, "not a UTF-8 JSON object"),
             (b'{"a": NaN}', 3, "NaN is not a finite number"),
             (b"[1, 2]", 3, "a record must be a JSON object, got list"),
             (b"[" * 50_000 + b"]" * 50_000, 3, "over the limit of 65,536"),
             (b"[" * 30_000 + b"]" * 30_000, 3, "not a UTF-8 JSON object"),
             (json.dumps({**good, "split": "train"}).encode(), 3, "split 'train' is not one of eval_splits"),
             (json.dumps({**good, "headings": [0.5]}).encode(), 3, "one number per trajectory viewpoint \\(2\\)"),
             (json.dumps({**good, "trajectory": []}).encode(), 3, "'trajectory' must be a non-empty list"),
             (json.dumps({**good, "instr_id": 7}).encode(), 3, "'instr_id' must be a string"),
             # File names and a read path are built from these: only the data's own ids pass.
             (json.dumps({**good, "instr_id": "../../x"}).encode(), 3, "instr_id '../../x' is not an episode of "
                                                                       "split val_unseen"),
             (json.dumps({**good, "scan": "../" + episode.scan}).encode(), 3,
              f"scan '../{episode.scan}' is not the scan of episode {episode.instr_id}"),
             (json.dumps({**good, "scan": "unknown"}).encode(), 3, "scan 'unknown' is not the scan of episode")]
    for record, eval_episode, why in cases:
        with pytest.raises(WireError, match=why):
            decode(record, eval_episode)
    assert len(b"[" * 50_000 + b"]" * 50_000) > MAX_RECORD_BYTES
    cartpole = serve(problem="cartpole")
    with pytest.raises(WireError, match="this run's Problem takes no episode records"):
        decode(json.dumps(good).encode(), service=cartpole.service)


def test_an_episode_record_that_cannot_travel_is_refused_where_it_is_made():
    from fleetrl.proto.episode_records import encode_record

    assert json.loads(encode_record({"trajectory": ["a"], "headings": [0.5]})) == {"trajectory": ["a"],
                                                                                    "headings": [0.5]}
    with pytest.raises(ValueError, match="finite numbers, strings and lists"):
        encode_record({"heading": float("nan")})
    with pytest.raises(ValueError, match="finite numbers, strings and lists"):
        encode_record({"features": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="over the limit of 65,536; keep Problem.episode_record to a summary"):
        encode_record({"trajectory": ["a" * 32] * 3000})


def test_a_scan_id_that_is_a_path_reads_no_file(synthetic):
    from fleetrl.envs.r2r.graph import DataError, load_scan_graph

    out, _ = synthetic
    for scan in ("../r2r/connectivity/x", "/etc/passwd", ".hidden", ""):
        with pytest.raises(DataError, match="is not a scan id"):
            load_scan_graph(os.path.join(out, "connectivity"), scan)
