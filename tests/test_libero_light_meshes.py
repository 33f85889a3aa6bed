"""Light meshes (LiberoEnv's mesh_detail): fewer faces to render, the physics unchanged."""

import numpy as np
import pytest

from fleetrl.envs.libero.env import LiberoEnv
from fleetrl.envs.libero.light_meshes import decimate

MESH = 7  # mujoco.mjtGeom.mjGEOM_MESH


def sphere_as_mujoco_holds_it(rings: int = 40) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A textured unit sphere with a vertex per face corner, as MuJoCo's compiled meshes are:
    vertices [3F, 3], faces [F, 3], texture-coordinate faces [F, 3] into [3F] coordinates."""
    theta, phi = np.linspace(0, np.pi, rings + 1), np.linspace(0, 2 * np.pi, rings + 1)
    grid = np.stack(np.meshgrid(theta, phi, indexing="ij"), -1)
    corners = []
    for i in range(rings):
        for j in range(rings):
            a, b, c, d = grid[i, j], grid[i + 1, j], grid[i + 1, j + 1], grid[i, j + 1]
            corners += [(a, b, c), (a, c, d)]
    angles = np.array(corners).reshape(-1, 2)
    vertices = np.stack([np.sin(angles[:, 0]) * np.cos(angles[:, 1]), np.sin(angles[:, 0]) * np.sin(angles[:, 1]),
                         np.cos(angles[:, 0])], 1).astype(np.float32)
    faces = np.arange(len(vertices), dtype=np.int32).reshape(-1, 3)
    area = np.linalg.norm(np.cross(vertices[faces[:, 1]] - vertices[faces[:, 0]],
                                   vertices[faces[:, 2]] - vertices[faces[:, 0]]), axis=1)
    faces = faces[area > 1e-9]  # the poles' slivers
    return vertices, faces, faces.copy()


def surface_area(vertices: np.ndarray, faces: np.ndarray) -> float:
    a, b, c = (vertices[faces[:, k]].astype(np.float64) for k in range(3))
    return float(np.linalg.norm(np.cross(b - a, c - a), axis=1).sum() / 2)


@pytest.mark.libero  # fast-simplification comes with the libero extra
def test_a_decimated_mesh_keeps_its_shape_with_a_quarter_of_its_faces_and_only_original_corners():
    vertices, faces, texcoord_faces = sphere_as_mujoco_holds_it()
    normal_faces = faces[:, ::-1].copy()  # any indices: they follow their face
    new_faces, new_texcoord_faces, new_normal_faces = decimate(vertices, faces, texcoord_faces, normal_faces, 0.25)
    assert 0.2 * len(faces) < len(new_faces) < 0.3 * len(faces)
    positions = vertices[new_faces]
    assert np.all(np.linalg.norm(positions[:, 0] - positions[:, 1], axis=1) > 0)  # no degenerate faces
    assert np.all(np.linalg.norm(positions[:, 1] - positions[:, 2], axis=1) > 0)
    # Each kept face takes the texture coordinates and normals of one original face.
    original = {tuple(row): i for i, row in enumerate(texcoord_faces)}
    rows = [original[tuple(row)] for row in new_texcoord_faces]
    np.testing.assert_array_equal(new_normal_faces, normal_faces[rows])
    assert surface_area(vertices, new_faces) == pytest.approx(surface_area(vertices, faces), rel=0.05)
    again = decimate(vertices, faces, texcoord_faces, normal_faces, 0.25)
    for first, second in zip((new_faces, new_texcoord_faces, new_normal_faces), again):
        np.testing.assert_array_equal(first, second)


@pytest.mark.slow
@pytest.mark.libero
def test_light_meshes_change_the_images_a_little_and_the_physics_not_at_all(tmp_path, monkeypatch):
    """Same seeds and actions in a whole scene and a light one: the simulator's states are
    equal at every step; the images differ by a few levels of 255; the scene built again (the
    light env rebuilds at each reset) reuses its decimated meshes and renders exactly as the
    first time."""
    monkeypatch.setenv("LIBERO_CONFIG_PATH", str(tmp_path))
    settings = {"image_size": 64, "num_wait_steps": 3, "max_episode_steps": 40}
    whole = LiberoEnv("libero_10", (0,), **settings)  # a living room
    light = LiberoEnv("libero_10", (0,), mesh_detail=0.25, soft_reset=False, **settings)
    rng = np.random.default_rng(0)
    first_frames, decimated_meshes = [], []
    try:
        for trial in (0, 3, 0):
            options = {"task_index": 0, "trial": trial}
            expected, _ = whole.reset(seed=2, options=options)
            got, _ = light.reset(seed=2, options=options)
            first_frames.append(got)
            for _ in range(4):
                np.testing.assert_array_equal(light._sim.env.sim.get_state().flatten(),
                                              whole._sim.env.sim.get_state().flatten())
                np.testing.assert_array_equal(got["state"], expected["state"])
                for camera in ("main_image", "wrist_image"):
                    change = np.abs(got[camera].astype(int) - expected[camera]).mean()
                    assert 0 < change < 10, (camera, options, change)
                action = rng.uniform(-1, 1, 7).astype(np.float32)
                expected, got = whole.step(action)[0], light.step(action)[0]
            whole_model, light_model = whole._sim.env.sim.model._model, light._sim.env.sim.model._model
            colliding = {int(m) for g, m in enumerate(whole_model.geom_dataid) if whole_model.geom_type[g] == MESH
                         and (whole_model.geom_contype[g] or whole_model.geom_conaffinity[g])}
            for mesh in colliding:
                assert light_model.mesh_facenum[mesh] == whole_model.mesh_facenum[mesh]
            assert light_model.mesh_facenum.sum() < 0.4 * whole_model.mesh_facenum.sum()
            decimated_meshes.append(len(light._decimated))
        assert decimated_meshes[0] == decimated_meshes[1] == decimated_meshes[2] > 0  # rebuilt: no new ones
        for key in first_frames[0]:
            np.testing.assert_array_equal(first_frames[2][key], first_frames[0][key])
    finally:
        whole.close()
        light.close()
