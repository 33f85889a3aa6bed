"""Lighter LIBERO scenes for CPU hosts: each visual mesh keeps a fraction of its faces.

On a CPU host (Mesa's llvmpipe) a LIBERO render costs what its visual meshes' triangles
cost (about 400k in a scene; with them hidden a render is 30x cheaper), whatever the image
size. `decimate_visual_meshes` thins those meshes in the compiled model, before the render
context uploads them:

- Only meshes that no colliding geom uses are touched, and only their faces: collisions
  use meshes of their own, inertias were computed at compile time, so the physics is the
  same bit for bit (tests/test_libero_light_meshes.py).
- Quadric decimation (fast-simplification) decides which vertices merge. Each merged
  cluster is then drawn at the original vertex nearest the decimated position, and each
  kept face keeps the texture coordinates and normals of the original face it came from.
  So the model's vertex, normal and texture arrays stay as they are: a mesh's leading faces
  are rewritten, and its face count lowered.

What changes in the images is measured in docs/libero.md. Decimating a scene takes a second
or two; `DecimatedFaces` keeps each mesh's result, so a scene built again costs a lookup.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # mujoco comes with the libero extra; this module imports without it
    import mujoco

# Meshes with fewer faces are left whole: they cost little, and small props lose their shape.
MIN_FACES = 500

# A mesh's decimated faces: vertex, texture-coordinate and normal indices, [F, 3] each.
MeshFaces = tuple[np.ndarray, np.ndarray, np.ndarray]


class DecimatedFaces(dict[bytes, MeshFaces]):
    """Decimated meshes by the digest of their data and the fraction kept."""

    @staticmethod
    def key(vertices: np.ndarray, faces: np.ndarray, texcoord_faces: np.ndarray, keep: float) -> bytes:
        digest = hashlib.blake2b(digest_size=16)
        for array in (vertices, faces, texcoord_faces, np.float64(keep)):
            digest.update(np.ascontiguousarray(array).tobytes())
        return digest.digest()


def visual_meshes(model: mujoco.MjModel) -> list[int]:
    """Ids of the meshes that only non-colliding geoms use."""
    import mujoco

    is_mesh = model.geom_type == mujoco.mjtGeom.mjGEOM_MESH
    colliding = (model.geom_contype != 0) | (model.geom_conaffinity != 0)
    used = set(model.geom_dataid[is_mesh].tolist())
    return sorted(used - set(model.geom_dataid[is_mesh & colliding].tolist()))


def decimate_visual_meshes(model: mujoco.MjModel, keep: float, cache: DecimatedFaces) -> tuple[int, int]:
    """Keeps about `keep` of the faces of every visual mesh of `model`, in place; the
    faces of those meshes before and after. The render context must be made afresh."""
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"the fraction of mesh faces kept must be in (0, 1], got {keep}")
    before = after = 0
    for mesh in visual_meshes(model):
        start, count = model.mesh_faceadr[mesh], model.mesh_facenum[mesh]
        before += count
        if keep == 1.0 or count < MIN_FACES:
            after += count
            continue
        vertices = model.mesh_vert[model.mesh_vertadr[mesh]:model.mesh_vertadr[mesh] + model.mesh_vertnum[mesh]]
        faces = model.mesh_face[start:start + count]
        texcoord_faces = model.mesh_facetexcoord[start:start + count]
        key = cache.key(vertices, faces, texcoord_faces, keep)
        if key not in cache:
            cache[key] = decimate(vertices, faces, texcoord_faces, model.mesh_facenormal[start:start + count], keep)
        new_faces, new_texcoord_faces, new_normal_faces = cache[key]
        kept = len(new_faces)
        model.mesh_face[start:start + kept] = new_faces
        model.mesh_facetexcoord[start:start + kept] = new_texcoord_faces
        model.mesh_facenormal[start:start + kept] = new_normal_faces
        model.mesh_facenum[mesh] = kept
        after += kept
    return before, after


def decimate(vertices: np.ndarray, faces: np.ndarray, texcoord_faces: np.ndarray, normal_faces: np.ndarray,
             keep: float) -> MeshFaces:
    """One mesh's decimated faces, indexing its original vertices, texture coordinates and
    normals (MuJoCo's meshes hold a vertex per face corner: they are welded by position first)."""
    import fast_simplification

    positions, welded = np.unique(vertices.astype(np.float64), axis=0, return_inverse=True)
    welded = welded.reshape(-1)
    welded_faces = welded[faces]
    _, _, collapses = fast_simplification.simplify(positions, welded_faces, target_reduction=1.0 - keep,
                                                   return_collapses=True)
    merged, _, cluster = fast_simplification.replay_simplification(positions, welded_faces, collapses)
    # Each cluster is drawn at its member nearest the decimated position.
    distance = np.linalg.norm(positions - merged[cluster], axis=1)
    order = np.lexsort((distance, cluster))
    first = np.ones(len(order), bool)
    first[1:] = cluster[order][1:] != cluster[order][:-1]
    nearest = np.empty(len(merged), np.int64)
    nearest[cluster[order][first]] = order[first]
    a_vertex_at = np.empty(len(positions), np.int64)  # a welded position's first original vertex
    a_vertex_at[welded[::-1]] = np.arange(len(welded))[::-1]
    # A face survives if its corners fall in three clusters, once per cluster triple and winding.
    corners = cluster[welded_faces]
    whole = (corners[:, 0] != corners[:, 1]) & (corners[:, 1] != corners[:, 2]) & (corners[:, 0] != corners[:, 2])
    triples = corners[whole]
    turns = (np.arange(3) + np.argmin(triples, axis=1)[:, None]) % 3  # smallest cluster first
    _, first_face = np.unique(np.take_along_axis(triples, turns, axis=1), axis=0, return_index=True)
    kept = np.flatnonzero(whole)[np.sort(first_face)]
    if len(kept) == 0:  # nothing left to draw: keep the mesh whole
        return faces.copy(), texcoord_faces.copy(), normal_faces.copy()
    new_faces = a_vertex_at[nearest[corners[kept]]].astype(faces.dtype)
    return new_faces, texcoord_faces[kept].copy(), normal_faces[kept].copy()
