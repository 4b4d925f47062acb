"""`voxpipe encode`: every manifest row's audio (and ref_audio) through the AudioVAE once, offline.

Upstream re-encodes each clip on every training step, one clip at a time. Here each clip is
padded on the right to a multiple of hop × patch_size (2560 samples), exactly as upstream's packer
pads it, and encoded in batches of similar length (small ones on CPU, where the VAE is
memory-bound); the encoder is causal, so the batch's extra right padding never changes a clip's
frames, which are then cropped back to the clip's own padded length. Text goes through the
checkpoint's tokenizer.

Under torchrun the work is split without changing a single bit of the result. Batch composition
and the CPU thread count change float sums (by about 1e-7), so the batches are planned once over
every clip of the set, exactly as one process plans them, whole batches are dealt to the ranks,
and each process runs `encode.cpu_threads` threads whatever the world size. Each rank encodes on
its own device and writes its own shards; rank 0 merges the index (see voxpipe.data.shards).

Layout of `out/`:
- `shards/lat-*.safetensors`: fp32 latents [frames, 64], one tensor per clip named by the sha256
  of the audio file's bytes; `shards/tok-*.safetensors`: int32 token ids named by sha256 of the text.
- `index.jsonl`: one line per complete, checksummed shard. A clip is encoded again only when
  (audio sha256, VAE hash) is not in it, so reruns do no VAE work and an interrupted run resumes
  with the batches it had not registered. Shard names derive from their content, so a resumed
  1-process run produces the very files an uninterrupted one would.
- `<manifest name>.jsonl` per input manifest (see `encoded_row`), `quarantine.jsonl`, `report.json`.
"""
