"""The accelerators recipes plan for, and their memory: a table below every layer, free of torch
(params.yaml's schema validates `plan.device` against it)."""


# Memory of one device, GiB, as its vendor states it (HBM/GDDR capacities are binary units); the
# planner (`voxpipe plan`) compares a per-device peak with it. One Ascend 910C package holds two
# dies that torch_npu sees as two devices, so the 910C entry is one die.
# Sources: NVIDIA data sheets (H100 SXM/PCIe 80 GB, H200 141 GB, A100 40/80 GB, L40S 48 GB, L4 24 GB,
# GeForce RTX 4090 / 3090 24 GB); Huawei Atlas 800T A2 (Ascend 910B 64 GB HBM per NPU; the 910B4
# variant 32 GB) and Atlas 900 A3 SuperPoD (Ascend 910C 128 GB per package = 2 dies x 64 GB).
DEVICE_MEMORY_GIB: dict[str, float] = {
    "ascend-910b": 64.0,
    "ascend-910b4": 32.0,
    "ascend-910c-die": 64.0,
    "h200": 141.0,
    "h100-80gb": 80.0,
    "a100-80gb": 80.0,
    "a100-40gb": 40.0,
    "l40s": 48.0,
    "rtx-4090": 24.0,
    "rtx-3090": 24.0,
    "l4": 24.0,
}
