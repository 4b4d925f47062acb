"""Finishing a row that left the batch: its patches decoded by the VAE and the audio marked (marks.py).

On the CPU each of the batcher's finishing threads hands its rows to a worker process of its own, which
holds a copy of the VAE and PerTh's networks. Run in the server's own threads, decoding and marking took
the generating thread's interpreter lock: on this project's 2-core machine the batch's patches took 39 %
longer while one mark ran beside them in a thread, and no longer while it ran in another process. On an
accelerator the VAE runs where the model is, in the finishing thread itself.

The workers run FINISHING_NICE below the server's CPU priority: each generated patch is what every row of the
batch waits on, a finished row only its own request. At the same priority the two workers and the generating
thread shared this machine's 2 cores three ways: under 8 listeners the generating thread ran 74-76 % of the
time, niced 82-85 %, and 8 listeners were answered 16.6-16.9 requests/s, not 15.3-16.1 (runs of 128 requests;
nice 10 kept fewer rows in the batch and gained nothing more).

A worker that dies (killed, out of memory) fails the row it had with one paragraph, and the next row starts
a new one. A worker whose server is gone sees its pipe close and exits.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load, save

from voxpipe.errors import StepError
from voxpipe.evaluate.marks import marker
from voxpipe.model.voxcpm2 import decode_patches

if TYPE_CHECKING:
    from voxpipe.model.voxcpm2 import VoxCPM2

log = logging.getLogger("voxpipe.serve")
FINISHING_NICE = 5  # a worker's nice increment over the server's
Finish = Callable[[torch.Tensor], np.ndarray]  # a row's patches [n, P, D] -> its marked mono float32 audio


def finishers(model: VoxCPM2, watermark: str, count: int, threads: int) -> list[Finish]:
    """One `Finish` per finishing thread: a worker process each (`threads` torch threads) where the model
    runs on the CPU, else the thread's own decode and mark."""
    if next(model.parameters()).device.type != "cpu":
        mark, rate = marker(watermark), model.audio_vae.out_sample_rate

        def finish(patches: torch.Tensor) -> np.ndarray:
            audio, _ = model.decode(patches)
            return mark(audio.numpy().astype(np.float32), rate)

        return [finish] * count
    workers = [FinishingProcess(model, watermark, threads, i) for i in range(count)]
    for w in workers:
        w.ready()  # started together, waited for together
    return workers


class FinishingProcess:
    """A worker process with the model's VAE and the mark, and the pipe to it. Called by one thread."""

    def __init__(self, model: VoxCPM2, watermark: str, threads: int, index: int) -> None:
        vae = model.audio_vae
        # as safetensors bytes: a pickled tensor would go through torch's shared memory, a file descriptor
        # per tensor
        state = save({k: v.detach().cpu().contiguous() for k, v in vae.state_dict().items()})
        self._start_args = (watermark, threads, vae.config, state, model.patch_size)
        self._name = f"voxpipe-finishing-{index}"
        self._start()

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")  # fork would copy the server's threads' locks
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_work, args=(child, *self._start_args), name=self._name,
                                        daemon=True)
        self._process.start()
        child.close()

    def ready(self) -> None:
        """Waits for the worker's first answer: its VAE loaded and the mark's networks warm."""
        kind, value = self._answer()
        if kind == "error":
            raise value

    def __call__(self, patches: torch.Tensor) -> np.ndarray:
        if not self._process.is_alive():
            self._start()
            self.ready()
        self._conn.send(patches.numpy())
        kind, value = self._answer()
        if kind == "error":
            raise value
        return value

    def _answer(self) -> tuple[str, Any]:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            self._process.join(5)
            code = self._process.exitcode
            log.error("voxpipe serve: the finishing process %s ended (exit code %s)", self._name, code)
            raise StepError(f"serve: the process that decodes and marks audio ({self._name}) ended with exit "
                            f"code {code} (killed, or out of memory?); this row is lost and the next starts "
                            "a new one. If it repeats, give the server more memory") from None


def _work(conn: Connection, watermark: str, threads: int, vae_config: Any, vae_state: bytes, patch_size: int
          ) -> None:
    """The worker: answers ("ready", None) once loaded, then ("audio", array) or ("error", exception) per
    row, until its server closes the pipe."""
    from voxpipe.model.audiovae import AudioVAE

    os.nice(FINISHING_NICE)
    torch.set_num_threads(threads)
    try:
        vae = AudioVAE(vae_config)
        vae.load_state_dict(load(vae_state))
        vae.eval().requires_grad_(False)
        mark = marker(watermark)
        mark(np.zeros(vae.out_sample_rate // 10, np.float32), vae.out_sample_rate)  # loads its networks
    except Exception as e:  # noqa: BLE001 - the server's load fails with it
        conn.send(("error", e))
        return
    conn.send(("ready", None))
    while True:
        try:
            patches = conn.recv()
        except (EOFError, OSError):  # the server is gone
            return
        try:
            audio, _ = decode_patches(vae, torch.from_numpy(patches), patch_size)
            answer = ("audio", mark(audio.numpy().astype(np.float32), vae.out_sample_rate))
        except Exception as e:  # noqa: BLE001 - that row's answer
            answer = ("error", e)
        try:
            conn.send(answer)
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its words
            conn.send(("error", RuntimeError(f"{type(answer[1]).__name__}: {answer[1]}"[:500])))
