"""DeviceMesh: the ranks of a job laid out as an n-D array, one process group per mesh dimension.

`init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))` arranges the default group's ranks
row-major in a (2, 4) array; for each mesh dimension every process joins the group of the ranks that
differ from it only along that dimension (`new_group` underneath, created by every rank in the same
order, as `new_group` requires). `mesh["tp"]` is the 1-D sub-mesh this rank belongs to (sharing the
groups already made); `get_group(dim)`, `size(dim)`, `get_local_rank(dim)` and
`get_coordinate()` answer what DTensor, tensor parallel and FSDP ask of it (PyTorch's
`torch.distributed.device_mesh`).
"""
from __future__ import annotations

import os
import warnings

import numpy as np

from .. import cuda
from . import distributed_c10d as c10d

__all__ = ["DeviceMesh", "init_device_mesh"]


class DeviceMesh:
    """An n-D array of global ranks and, per dimension, the process group of this rank's slice."""

    def __init__(self, device_type: str, mesh, *, mesh_dim_names: tuple | None = None,
                 _init_backend: bool = True, _groups: list | None = None) -> None:
        self.device_type = device_type
        self.mesh = np.asarray(mesh, dtype=np.int64)
        if self.mesh.ndim == 0:
            raise ValueError("DeviceMesh: mesh must have at least one dimension")
        if mesh_dim_names is not None:
            mesh_dim_names = tuple(mesh_dim_names)
            if len(mesh_dim_names) != self.mesh.ndim:
                raise RuntimeError(f"DeviceMesh: mesh_dim_names {mesh_dim_names} must name each of the "
                                   f"{self.mesh.ndim} mesh dimensions")
            if len(set(mesh_dim_names)) != len(mesh_dim_names):
                raise RuntimeError(f"DeviceMesh: mesh_dim_names {mesh_dim_names} must be unique")
        self.mesh_dim_names = mesh_dim_names
        flat = self.mesh.reshape(-1).tolist()
        if len(set(flat)) != len(flat):
            raise RuntimeError(f"DeviceMesh: the mesh {self.mesh.tolist()} repeats a rank")
        me = c10d.get_rank()
        hits = np.argwhere(self.mesh == me)
        self._coordinate = tuple(int(c) for c in hits[0]) if len(hits) else None
        if _groups is not None:
            self._groups = list(_groups)
        elif _init_backend:
            self._groups = [self._make_groups(d) for d in range(self.mesh.ndim)]
        else:
            self._groups = [None] * self.mesh.ndim

    def _make_groups(self, dim: int):
        """The group of this rank along `dim`; every rank creates every slice's group (same order)."""
        mine = None
        moved = np.moveaxis(self.mesh, dim, -1).reshape(-1, self.mesh.shape[dim])
        for ranks in moved.tolist():
            if len(ranks) == c10d.get_world_size() and ranks == sorted(ranks):
                pg = c10d._default()           # the whole world in order: the default group itself
            else:
                pg = c10d.new_group(ranks)
            if c10d.get_rank() in ranks:
                mine = pg
        return mine

    # -- queries ---------------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return self.mesh.ndim

    @property
    def shape(self) -> tuple:
        return tuple(self.mesh.shape)

    def size(self, mesh_dim: int | str | None = None) -> int:
        if mesh_dim is None:
            return int(self.mesh.size)
        return int(self.mesh.shape[self._dim(mesh_dim)])

    def _dim(self, mesh_dim: int | str) -> int:
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"Mesh dimension '{mesh_dim}' does not exist. Available mesh dimensions are: "
                               f"mesh_dim_names={self.mesh_dim_names}")
            return self.mesh_dim_names.index(mesh_dim)
        if not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"DeviceMesh: mesh dimension {mesh_dim} out of range for a {self.ndim}-D mesh")
        return mesh_dim % self.ndim

    def get_group(self, mesh_dim: int | str | None = None):
        """The process group of this rank along `mesh_dim` (required unless the mesh is 1-D)."""
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError(f"Found the DeviceMesh have {self.ndim} dimensions. Optional kwarg `mesh_dim` "
                                   "needs to be specified when device_mesh.ndim > 1.")
            mesh_dim = 0
        return self._groups[self._dim(mesh_dim)]

    def get_all_groups(self) -> list:
        return list(self._groups)

    def get_rank(self) -> int:
        return c10d.get_rank()

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's index along `mesh_dim` (its rank in that dimension's group)."""
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError("DeviceMesh.get_local_rank: mesh_dim is required when device_mesh.ndim > 1")
            mesh_dim = 0
        if self._coordinate is None:
            return -1
        return self._coordinate[self._dim(mesh_dim)]

    def get_coordinate(self) -> list | None:
        """This rank's index along every mesh dimension (None when it is not in the mesh)."""
        return None if self._coordinate is None else list(self._coordinate)

    def __getitem__(self, names) -> "DeviceMesh":
        """The sub-mesh of this rank over the named dimensions (`mesh["tp"]`, `mesh["dp", "tp"]`)."""
        names = (names,) if isinstance(names, str) else tuple(names)
        if not self.mesh_dim_names:
            raise RuntimeError("Cannot slice a DeviceMesh without mesh_dim_names.")
        dims = [self._dim(n) for n in names]
        if self._coordinate is None:
            raise RuntimeError("DeviceMesh: cannot slice a mesh this rank is not part of")
        index = tuple(slice(None) if d in dims else self._coordinate[d] for d in range(self.ndim))
        sub = self.mesh[index]
        if dims != sorted(dims):
            order = np.argsort(np.argsort(dims))
            sub = np.transpose(sub, order)
        out = DeviceMesh(self.device_type, sub, mesh_dim_names=names, _groups=[self._groups[d] for d in dims])
        out._root_mesh = self._get_root_mesh()
        return out

    def _get_root_mesh(self) -> "DeviceMesh":
        """The mesh this one was sliced from (itself when it was not): FSDP over a TP sub-mesh lays its
        parameters out on their common root."""
        return getattr(self, "_root_mesh", None) or self

    def __eq__(self, other) -> bool:
        return isinstance(other, DeviceMesh) and self.device_type == other.device_type and \
            self.mesh.shape == other.mesh.shape and bool((self.mesh == other.mesh).all())

    def __hash__(self) -> int:
        return hash((self.device_type, tuple(self.mesh.reshape(-1).tolist()), self.mesh.shape))

    def __repr__(self) -> str:
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}{names})"


def _choose_cuda_device() -> None:
    """PyTorch's DeviceMesh rule: a process that has not used cuda yet takes device LOCAL_RANK (a launcher's),
    else global rank % the host's device count, with PyTorch's warning; one that has keeps its choice."""
    if cuda.is_initialized() or not cuda.is_available():
        return
    if "LOCAL_RANK" in os.environ:
        cuda.set_device(int(os.environ["LOCAL_RANK"]))
        return
    per_host = cuda.device_count()
    world = c10d.get_world_size()
    warnings.warn("It seems like you did not set/select the default device for the current process before the "
                  "DeviceMesh initialization or use a launcher (i.e. torchrun) which populates `LOCAL_RANK` "
                  "environment variable. It is recommended to set the current device for the process BEFORE the "
                  "DeviceMesh initialization so that the underlying communicator (i.e. NCCL) can be initialized "
                  "properly. Given that the current process has no default device selected, DeviceMesh will use a "
                  "heuristic to set the device_id via `global_rank % num_devices_per_host`, assuming homogeneous "
                  "hardware cluster. ", stacklevel=3)
    if world > per_host and world % per_host:
        raise RuntimeError(f"DeviceMesh only support homogeneous hardware, but found {world} ranks and {per_host} "
                           "cuda devices!")
    cuda.set_device(c10d.get_rank() % per_host)


def init_device_mesh(device_type: str, mesh_shape: tuple, *, mesh_dim_names: tuple | None = None,
                     backend_override=None) -> DeviceMesh:
    """A mesh of the default group's ranks laid out row-major in `mesh_shape` (initialising the default
    group from the environment when none exists, as PyTorch does)."""
    if not isinstance(device_type, str) or device_type.split(":")[0] not in ("cpu", "cuda", "meta"):
        raise RuntimeError(f"init_device_mesh: device_type must be 'cpu' or 'cuda' (no index), got {device_type!r}")
    if ":" in device_type:
        raise RuntimeError(f"Device type with index is not supported but got {device_type}. If you maintained a "
                           "'torch.device' object, it's recommended to pass in 'device.type'.")
    mesh_shape = tuple(int(s) for s in mesh_shape)
    if mesh_dim_names is not None and len(mesh_dim_names) != len(mesh_shape):
        raise RuntimeError("mesh_shape and mesh_dim_names should have same length! "
                           f"Found len(mesh_dim_names): {len(mesh_dim_names)} and len(mesh_shape):{len(mesh_shape)}.")
    if not c10d.is_initialized():
        c10d.init_process_group("nccl" if device_type == "cuda" else "gloo")
    if device_type == "cuda":
        _choose_cuda_device()
    world = c10d.get_world_size()
    n = int(np.prod(mesh_shape)) if mesh_shape else 1
    if n != world:
        raise RuntimeError(f"init_device_mesh: mesh_shape {mesh_shape} holds {n} ranks but the world size is {world}")
    mesh = np.arange(world, dtype=np.int64).reshape(mesh_shape)
    return DeviceMesh(device_type, mesh, mesh_dim_names=mesh_dim_names)
