"""The child process that decodes for asr.PocketSphinx: `python -m voxpipe.data.pocketsphinx_worker`.

pocketsphinx's decoder holds the GIL for a whole utterance, so evaluate runs it in a process of its own.
A plain child over pipes rather than multiprocessing: multiprocessing's spawn re-runs the caller's main
module in the child, which breaks every script that calls evaluate without a `__main__` guard.
Protocol, both ways: a 4-byte little-endian length, then that many bytes: 16 kHz mono int16 PCM in; out,
the CPU seconds the decoding took (a little-endian double: evaluate's run.json counts them), the
confidence (a double, NaN for none: `confidence`) and the UTF-8 transcript. End of input ends the process.
"""

from __future__ import annotations

import math
import struct
import sys
import time
from typing import BinaryIO

from voxpipe.voxcpm2_format import SAMPLE_RATE

# Active HMMs per frame (pocketsphinx's default 30000). On the sample's real clips 3000 decodes 2x
# faster for WER 0.82 instead of 0.78, and on the noise of a model that does not stop yet 3x
# faster: there the default spends ~0.7 s per audio second searching.
MAX_HMM_PER_FRAME = 3000
LENGTH = struct.Struct("<I")
CPU = struct.Struct("<d")
CONFIDENCE = struct.Struct("<d")
NOT_WORDS = ("<s>", "</s>", "<sil>")  # segments that are no word of the transcript (fillers are [NOISE]...)


def read_message(stream: BinaryIO) -> bytes | None:
    """One length-prefixed message; None at the end of the stream."""
    head = stream.read(LENGTH.size)
    if len(head) < LENGTH.size:
        return None
    return stream.read(LENGTH.unpack(head)[0])


def write_message(stream: BinaryIO, body: bytes) -> None:
    stream.write(LENGTH.pack(len(body)) + body)
    stream.flush()


def confidence(posterior: float, words: int) -> float:
    """pocketsphinx's equivalent of an average log-probability: the natural log of the hypothesis'
    posterior (its lattice's, `Hypothesis.prob`) per word heard; NaN when no word was heard."""
    return math.log(max(posterior, 1e-300)) / words if words else math.nan


def serve(source: BinaryIO, sink: BinaryIO) -> None:
    from pocketsphinx import Decoder

    decoder = Decoder(samprate=SAMPLE_RATE, maxhmmpf=MAX_HMM_PER_FRAME, loglevel="FATAL")
    while (pcm := read_message(source)) is not None:
        # an empty clip: nothing heard (the decoder fails on none)
        start, text, score = time.process_time(), "", math.nan
        if pcm:
            decoder.start_utt()
            decoder.process_raw(pcm, full_utt=True)
            decoder.end_utt()
            hyp = decoder.hyp()
            if hyp is not None:
                words = sum(1 for seg in decoder.seg()
                            if seg.word not in NOT_WORDS and not seg.word.startswith("["))
                text, score = hyp.hypstr, confidence(hyp.prob, words)
        write_message(sink, CPU.pack(time.process_time() - start) + CONFIDENCE.pack(score) + text.encode())


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
