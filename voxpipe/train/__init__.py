"""FSDP2 training: device, sharded model, data, loop, checkpoints, LoRA, export."""
