"""Where training runs: the device, the process group and the data-parallel device mesh.

Under torchrun (WORLD_SIZE in the environment) the process group comes from torchrun's
rendezvous. A plain single process gets a private world of one over an in-memory store (no
ports, no env vars), so FSDP2, DCP and the full-state gather run the very same code path on a
laptop as on a cluster.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from voxpipe.device import DeviceChoice, resolve_device_type
from voxpipe.errors import StepError

BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    rank: int
    world_size: int
    mesh: DeviceMesh

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        dist.barrier()


def _set_local_device(device_type: str, local_rank: int) -> torch.device:
    """Bind this process to its accelerator before anything allocates on it (model, NCCL/HCCL)."""
    if device_type == "cpu":
        return torch.device("cpu")
    if device_type == "npu":
        # expandable segments avoid fragmentation OOMs with FSDP's varying all-gather buffers
        os.environ.setdefault("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True")
        torch.npu.set_device(local_rank)
    else:
        torch.cuda.set_device(local_rank)
    return torch.device(device_type, local_rank)


@contextmanager
def distributed_runtime(choice: DeviceChoice = "auto") -> Iterator[Runtime]:
    """Set the device, join (or create) the process group, build the 1-D mesh; tear down on exit."""
    device_type = resolve_device_type(choice)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _set_local_device(device_type, local_rank)
    backend = BACKENDS[device_type]
    if dist.is_initialized():
        raise StepError("a torch.distributed process group is already initialised in this process")
    if "WORLD_SIZE" in os.environ:  # torchrun (or any env:// launcher)
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        world = dist.get_world_size()
        mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("dp",))
        yield Runtime(device, dist.get_rank(), world, mesh)
    finally:
        dist.destroy_process_group()
