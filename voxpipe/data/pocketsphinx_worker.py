"""The child process that decodes for asr.PocketSphinx: `python -m voxpipe.data.pocketsphinx_worker`.

pocketsphinx's decoder holds the GIL for a whole utterance, so evaluate runs it in a process of its own.
A plain child over pipes rather than multiprocessing: multiprocessing's spawn re-runs the caller's main
module in the child, which breaks every script that calls evaluate without a `__main__` guard.
Protocol, both ways: a 4-byte little-endian length, then that many bytes: 16 kHz mono int16 PCM in; out,
the CPU seconds the decoding took (a little-endian double: evaluate's run.json counts them) and the
UTF-8 transcript. End of input ends the process.
"""

from __future__ import annotations

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


def read_message(stream: BinaryIO) -> bytes | None:
    """One length-prefixed message; None at the end of the stream."""
    head = stream.read(LENGTH.size)
    if len(head) < LENGTH.size:
        return None
    return stream.read(LENGTH.unpack(head)[0])


def write_message(stream: BinaryIO, body: bytes) -> None:
    stream.write(LENGTH.pack(len(body)) + body)
    stream.flush()


def serve(source: BinaryIO, sink: BinaryIO) -> None:
    from pocketsphinx import Decoder

    decoder = Decoder(samprate=SAMPLE_RATE, maxhmmpf=MAX_HMM_PER_FRAME, loglevel="FATAL")
    while (pcm := read_message(source)) is not None:
        start, text = time.process_time(), ""  # an empty clip: nothing heard (the decoder fails on none)
        if pcm:
            decoder.start_utt()
            decoder.process_raw(pcm, full_utt=True)
            decoder.end_utt()
            hyp = decoder.hyp()
            text = hyp.hypstr if hyp is not None else ""
        write_message(sink, CPU.pack(time.process_time() - start) + text.encode())


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
