"""The batcher between `voxpipe serve`'s routes and the model: one thread owns generation, and every request's
sentence is a row of one rolling batch (voxpipe/model/rolling.py).

- An idle batcher waits `serve.batch_window_ms` after a row arrives, so that requests arriving together
  start together; while the batch runs, waiting rows join it between patches (prefilled, their KV caches
  placed beside the running rows'), up to `serve.concurrency` rows.
- A row leaves when its sentence ends; another thread finishes it (decodes its audio and marks it, in a
  worker process on the CPU: finishing.py) while the batch goes on, and hands it to its request, which
  streams it. The request's next sentence joins the batch as soon as this row has left it, so it is
  generated while this one is finished. A request's first sentence is finished before later ones,
  whenever it left: it is the time to the first byte of someone waiting, while the others extend audio
  already playing. A second finishing thread takes a first sentence that is waiting (the first thread
  is busy), a row once two wait, and any row while the generating thread has none: it takes a core from
  the generating thread for someone waiting for their first byte, or when finishing falls behind.
  (Taking every row, it slowed the batch and the first byte under load; taking rows only while the batch
  was idle, eight listeners got 3.0x one's throughput, not 3.3-3.7x: benchmarks/serve.py.) Decoded in
  the generating thread, the 48 kHz VAE took as long as the batch's generation on a CPU and stalled every
  row; marked in each request's own thread, eight requests' marks took the CPU from the generating thread.
- Each row's deadline and client are checked before each of its patches: a row whose client left or whose
  deadline passed leaves there, and its request's slot (admission.py) goes back with it.
- Rows keep their own request's params (seed, cfg_value, inference_timesteps, max_len): a request's audio is
  what it would be alone.

No request thread runs the model or marks, so torch's threads (cores.py) are the batcher's alone: two
streams at once, the generating one and a finishing one.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from voxpipe.model.rolling import Finished, RollingBatch, Row
from voxpipe.serve.deadline import Deadline
from voxpipe.serve.request import Request, sized_max_len

if TYPE_CHECKING:
    from voxpipe.model.voxcpm2 import VoxCPM2
    from voxpipe.serve.finishing import Finish
    from voxpipe.serve.metrics import Metrics

log = logging.getLogger("voxpipe.serve")
DECODING_STREAMS = 2  # torch at work at once: the generating thread and a finishing one


@dataclass
class _Job:
    request: Request
    sentence: str
    deadline: Deadline
    queued_at: float  # when the row began to wait (a request's first: when it asked for admission)
    first: bool  # its request's first sentence: finished before later ones
    then: _Job | None = None  # the request's next sentence: it waits to join until this row leaves
    future: Future = field(default_factory=Future)

    def fail(self, e: BaseException) -> None:
        """This row's answer, and its request's later sentences' (they will not be said)."""
        job: _Job | None = self
        while job is not None:
            job.future.set_exception(e)
            job = job.then


class Batcher:
    def __init__(self, model: VoxCPM2, max_rows: int, window_s: float, finish: list[Finish],
                 metrics: Metrics | None = None) -> None:
        """finish: one per finishing thread (finishing.finishers); the first finishes whenever there is a
        row to, the others fewer while the generating thread runs (`_finish`)."""
        self.model, self.max_rows, self.window_s, self.metrics = model, max_rows, window_s, metrics
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # rows arrived: the generating thread waits on it
        self._finishable = threading.Condition(lock)  # rows to finish, or the generating thread idle
        self._waiting: deque[_Job] = deque()
        # a heap of (later sentence?, order it left, the row): a first sentence goes ahead of every later one
        self._finishing: list[tuple[bool, int, Finished]] = []
        self._left = itertools.count()
        self._idle = False  # the generating thread has no row to run
        # threads for the server's life
        threading.Thread(target=self._run, name="voxpipe-batcher", daemon=True).start()
        for i, f in enumerate(finish):
            threading.Thread(target=self._finish, args=(f, i > 0), name=f"voxpipe-finisher-{i}",
                             daemon=True).start()

    def submit(self, request: Request, sentences: list[str], deadline: Deadline,
               queued_at: float | None = None) -> list[Future]:
        """A checked request's sentences in its voice: one future per sentence, whose result is its audio
        (mono float32 at the model's rate) once its row has left the batch and been decoded and marked, or
        what stopped it (RequestStopped, ClientGone). The first sentence waits to join now; each later one
        once the one before it has left the batch, so it is generated while that one is finished."""
        jobs = [_Job(request, sentence, deadline, 0.0, i == 0) for i, sentence in enumerate(sentences)]
        for job, after in zip(jobs, jobs[1:], strict=False):
            job.then = after
        jobs[0].queued_at = time.perf_counter() if queued_at is None else queued_at
        with self._cond:
            self._waiting.append(jobs[0])
            self._cond.notify()
        return [job.future for job in jobs]

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
                    row.owner.fail(e)
                batch = RollingBatch(self.model)
                continue
            for f in finished:
                if f.error is not None:
                    f.row.owner.fail(f.error)
            self._follow([f.row.owner.then for f in finished if f.error is None and f.row.owner.then])
            if any(f.error is None for f in finished):
                with self._finishable:
                    for f in finished:
                        if f.error is None:
                            heapq.heappush(self._finishing, (not f.row.owner.first, next(self._left), f))
                    self._finishable.notify_all()

    # -- the finishing threads -------------------------------------------------------------------------
    def _finish(self, finish: Finish, second: bool) -> None:
        """Each row that left, decoded and marked: first sentences first, then in the order the rows left.
        One thread finishes whenever there is a row to; the others take a first sentence, any row once two
        wait, and any row while the generating thread has nothing to run (the heap's head is a later
        sentence only when no first sentence waits)."""
        while True:
            with self._finishable:
                while not self._finishing or (second and not self._idle and self._finishing[0][0]
                                              and len(self._finishing) < 2):
                    self._finishable.wait()
                f = heapq.heappop(self._finishing)[2]
            try:
                audio = finish(f.patches)
            except Exception as e:  # noqa: BLE001 - that row's answer
                f.row.owner.future.set_exception(e)
                continue
            f.row.owner.future.set_result(audio)

    def _follow(self, jobs: list[_Job]) -> None:
        """The next sentences of requests whose row left: they wait to join."""
        if jobs:
            now = time.perf_counter()
            with self._cond:
                for job in jobs:
                    job.queued_at = now
                    self._waiting.append(job)

    def _next(self, batch: RollingBatch) -> list[_Job]:
        """The rows that join now, first come first served (none while the batch is full); waits while there
        is nothing to do."""
        with self._cond:
            if not len(batch):
                self._idle = True
                self._finishable.notify_all()
                while not self._waiting:
                    self._cond.wait()
                self._idle = False
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
                job.fail(e)
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
                row.owner.fail(e)
