"""The batcher between `voxpipe serve`'s routes and the model: one thread owns generation, and every request's
sentence is a row of one rolling batch (voxpipe/model/rolling.py).

- An idle batcher waits `serve.batch_window_ms` after a row arrives, so that requests arriving together
  start together; while the batch runs, waiting rows join it between patches (prefilled, their KV caches
  placed beside the running rows'), up to `serve.concurrency` rows.
- A row leaves when its sentence ends; a second thread decodes its audio while the batch goes on, and hands
  it to its request, which streams it while its next sentence joins the batch. (Decoded in the generating
  thread, the 48 kHz VAE took as long as the batch's generation on a CPU, and stalled every row.)
- Each row's deadline and client are checked before each of its patches: a row whose client left or whose
  deadline passed leaves there, and its request's slot (admission.py) goes back with it.
- Rows keep their own request's params (seed, cfg_value, inference_timesteps, max_len): a request's audio is
  what it would be alone.

No request thread runs the model, so torch's threads (cores.py) are the batcher's two alone.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from voxpipe.model.rolling import Finished, RollingBatch, Row
from voxpipe.serve.deadline import Deadline
from voxpipe.serve.request import Request, sized_max_len

if TYPE_CHECKING:
    from voxpipe.model.voxcpm2 import VoxCPM2
    from voxpipe.serve.metrics import Metrics

log = logging.getLogger("voxpipe.serve")
DECODING_STREAMS = 2  # threads running torch ops at once: the generating one and the decoding one


@dataclass
class _Job:
    request: Request
    sentence: str
    deadline: Deadline
    queued_at: float  # when the row began to wait (a request's first: when it asked for admission)
    future: Future = field(default_factory=Future)


class Batcher:
    def __init__(self, model: VoxCPM2, max_rows: int, window_s: float, metrics: Metrics | None = None
                 ) -> None:
        self.model, self.max_rows, self.window_s, self.metrics = model, max_rows, window_s, metrics
        self._cond = threading.Condition()
        self._waiting: deque[_Job] = deque()
        self._decoding: queue.SimpleQueue[Finished] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="voxpipe-batcher", daemon=True).start()  # the server's life
        threading.Thread(target=self._decode, name="voxpipe-decoder", daemon=True).start()

    def say(self, request: Request, sentence: str, deadline: Deadline, queued_at: float | None = None
            ) -> np.ndarray:
        """One sentence of a checked request in its voice (mono float32 at the model's rate), once its row
        has left the batch and been decoded; raises what stopped it (RequestStopped, ClientGone)."""
        job = _Job(request, sentence, deadline, time.perf_counter() if queued_at is None else queued_at)
        with self._cond:
            self._waiting.append(job)
            self._cond.notify()
        return job.future.result()

    # -- the generation thread -------------------------------------------------------------------------
    def _run(self) -> None:
        batch = RollingBatch(self.model)
        while True:
            self._join(batch, self._next(batch))
            if not len(batch):
                continue
            if self.metrics is not None:
                self.metrics.batch_size.observe(len(batch))
            running = list(batch.rows)
            try:
                finished = batch.step()
            except Exception as e:  # noqa: BLE001 - a fault of the batch (out of memory): each row's answer
                log.exception("voxpipe serve: a batch of %d rows failed", len(running))
                for row in running:
                    row.owner.future.set_exception(e)
                batch = RollingBatch(self.model)
                continue
            for f in finished:
                if f.error is not None:
                    f.row.owner.future.set_exception(f.error)
                else:
                    self._decoding.put(f)

    def _decode(self) -> None:
        """The decoding thread: each finished row's audio, in the order the rows left."""
        while True:
            self._deliver(self._decoding.get())

    def _next(self, batch: RollingBatch) -> list[_Job]:
        """The rows that join now, first come first served (none while the batch is full); waits while there
        is nothing to do."""
        with self._cond:
            if not len(batch):
                while not self._waiting:
                    self._cond.wait()
                end = self._waiting[0].queued_at + self.window_s
                while len(self._waiting) < self.max_rows and (left := end - time.perf_counter()) > 0:
                    self._cond.wait(left)
            room = self.max_rows - len(batch)
            return [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]

    def _join(self, batch: RollingBatch, jobs: list[_Job]) -> None:
        rows = []
        device = self.model.enc_to_lm_proj.weight.device
        now = time.perf_counter()
        for job in jobs:
            if self.metrics is not None:
                self.metrics.queue_wait.observe(now - job.queued_at)
            r = job.request
            gen = r.generation
            try:
                job.deadline.check()  # a row whose client left, or whose time ran out, while it waited
                prompt = self.model.prompts([job.sentence], r.references[:1], r.reference_text)[0]
            except Exception as e:  # noqa: BLE001 - that row's answer
                job.future.set_exception(e)
                continue
            rows.append(Row(prompt, max_len=sized_max_len([job.sentence], r.max_len),
                            cfg_value=float(gen["cfg_value"]),
                            inference_timesteps=int(gen["inference_timesteps"]),
                            generator=torch.Generator(device).manual_seed(int(gen["seed"])),
                            check=job.deadline.check, owner=job))
        try:
            batch.join(rows)
        except Exception as e:  # noqa: BLE001 - the joining rows' answer; the running rows go on
            log.exception("voxpipe serve: %d rows could not join the batch", len(rows))
            for row in rows:
                row.owner.future.set_exception(e)

    def _deliver(self, f: Finished) -> None:
        job: _Job = f.row.owner
        try:
            audio, _ = self.model.decode(f.patches)
        except Exception as e:  # noqa: BLE001 - that row's answer
            job.future.set_exception(e)
            return
        job.future.set_result(audio.numpy().astype(np.float32))
