"""One deadline per request (`synthesize.deadline_s`), checked between generated patches: when it passes, or
the client has gone, generation stops there (each row of a rolling batch calls `check`), its caches leave the
batch with it, and the answer is a 503 naming the limit. Without it a request that a client or a proxy had
given up on kept a core and gigabytes for minutes (issue 34)."""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass, field

from voxpipe.errors import StepError
from voxpipe.steps.synthesize import SynthesizeParams

DEADLINE_S: float = SynthesizeParams.model_fields["deadline_s"].default


class RequestStopped(StepError):
    """A request's work ended before its audio was done: its deadline passed, or its client left."""


class ClientGone(RequestStopped):
    """The client closed the connection: what it asked for is stopped, and nobody gets the answer."""


@dataclass
class Deadline:
    seconds: float = DEADLINE_S
    start: float = field(default_factory=time.monotonic)
    gone: threading.Event = field(default_factory=threading.Event)  # set when the client has left
    source: str = "synthesize.deadline_s"  # where `seconds` came from, as a stopped request's answer says
    # seconds kept, per patch made, for what follows generation within the deadline (decoding the audio,
    # encoding the answer: the pyfunc's JSON); 0: nothing kept
    tail_s_per_patch: float = 0.0
    patches: int = 0

    def remaining(self) -> float:
        return self.start + self.seconds - time.monotonic()

    def gone_check(self) -> None:
        if self.gone.is_set():
            raise ClientGone("the client closed the connection; its generation was stopped")

    def check(self) -> None:
        """Called before each patch: raises when the client has gone, or when the deadline has passed (or
        would, with the time the patches made so far take to decode and send)."""
        self.gone_check()
        kept = self.patches * self.tail_s_per_patch
        self.patches += 1
        if self.remaining() <= kept:
            how = "ran past" if kept == 0 else "would have run past, decoding and sending its audio,"
            raise RequestStopped(
                f"the request {how} its {self.seconds:g} s deadline ({self.source}) and was stopped; send a "
                "shorter text, fewer inference_timesteps or a lower max_len"
            )


def release_memory() -> None:
    """What a stopped generation held goes back at once, not at the next collection (the accelerator's cache
    too)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
