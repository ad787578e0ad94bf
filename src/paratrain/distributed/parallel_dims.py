"""The parallel degrees of a run and the one DeviceMesh built from them.

Four degrees, outermost first, multiply to the world size (torchtitan's ParallelDims):

    pp            pipeline stages (consecutive blocks of the model)
    dp_replicate  data-parallel replicas (DDP; the replicated axis of HSDP)
    dp_shard      data-parallel ranks that shard weights, gradients and optimizer state (FSDP2)
    tp            tensor parallel: each layer's matrices split over these ranks

tp is innermost so that its ranks, which talk in every layer, are neighbours (the GPUs of one
NVLink domain); pp is outermost: stages exchange one activation per micro-batch. Everything that
needs a mesh axis, a process group or a data-parallel rank asks the ParallelDims of the run;
nothing else builds meshes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from paratrain.config.parallel import AXES, ParallelConfig


def resolve_degrees(cfg: ParallelConfig, world_size: int) -> dict[str, int]:
    """The four degrees for `world_size` ranks, with -1 / null filled in; ValueError naming the
    field when they do not multiply to the world size."""
    degrees = cfg.degrees()
    inferred = [a for a, v in degrees.items() if v == -1]
    if degrees["dp_replicate"] is None:
        degrees["dp_replicate"] = 1 if inferred else -1
        inferred = inferred or ["dp_replicate"]
    known = math.prod(v for v in degrees.values() if v != -1)
    if inferred:
        (axis,) = inferred
        if world_size % known:
            raise ValueError(
                f"parallel.{axis}: the other degrees multiply to {known}, which does not divide "
                f"the {world_size} processes"
            )
        degrees[axis] = world_size // known
    if math.prod(degrees.values()) != world_size:
        shown = " x ".join(f"{a}={v}" for a, v in degrees.items() if v != 1) or "all 1"
        raise ValueError(
            f"parallel: the degrees ({shown}) multiply to {math.prod(degrees.values())}, but the "
            f"run has {world_size} processes (launch.nproc x launch.nnodes)"
        )
    return degrees


@dataclass
class ParallelDims:
    """The resolved degrees and, once the process group exists, the mesh over them."""

    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int
    device_type: str = "cpu"
    tp_named: bool = False
    """strategy=tp: tensor parallelism is applied even over one rank (a degenerate mesh that
    runs the DTensor code paths, for tests on one GPU)."""
    _mesh: object = field(default=None, repr=False)

    @classmethod
    def from_config(
        cls, cfg: ParallelConfig, world_size: int, device_type: str, tp_named: bool = False
    ) -> ParallelDims:
        return cls(**resolve_degrees(cfg, world_size), device_type=device_type, tp_named=tp_named)

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1 or self.tp_named

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp_size(self) -> int:
        """Data-parallel degree: how many different batches one step trains on."""
        return self.dp_replicate * self.dp_shard

    @property
    def distributed(self) -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    @property
    def mesh(self):
        """The named DeviceMesh over all ranks (built on first use, once)."""
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            shape = tuple(getattr(self, a) for a in AXES)
            self._mesh = init_device_mesh(self.device_type, shape, mesh_dim_names=AXES)
        return self._mesh

    def submesh(self, *axes: str):
        """The sub-mesh over `axes` (e.g. "dp_shard", or "dp_replicate", "dp_shard" for HSDP)."""
        return self.mesh[axes[0]] if len(axes) == 1 else self.mesh[axes]

    def coordinate(self, axis: str) -> int:
        """This rank's index along `axis` (0 without a process group)."""
        if not self.distributed:
            return 0
        return self.mesh[axis].get_local_rank()

    @property
    def dp_rank(self) -> int:
        if not self.distributed:
            return 0
        return self.coordinate("dp_replicate") * self.dp_shard + self.coordinate("dp_shard")

    @property
    def pp_rank(self) -> int:
        return self.coordinate("pp")

    def describe(self) -> dict[str, int]:
        return {a: getattr(self, a) for a in AXES}

    def label(self) -> str:
        """'dp_shard=2 x tp=2' and the like: the degrees above 1."""
        parts = [f"{a}={getattr(self, a)}" for a in AXES if getattr(self, a) > 1]
        return " x ".join(parts) or "1 rank"
