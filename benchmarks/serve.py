"""`voxpipe serve`'s speed as a client sees it: real-time factor and time to first byte; prints JSON.

Starts `voxpipe serve` (a subprocess on 127.0.0.1), waits for /ready, then for a three-sentence input:
- the whole WAV (`response_format: wav`, not streamed): its wall time, seconds of audio, and the real-time
  factor (wall seconds per audio second; below 1 is faster than real time);
- the same input streamed (`pcm`): time to the first byte and to the last;
- `first_chunk_over_full`: streaming's first byte over the whole WAV's time (issue 30 asks for <= 0.5).
Medians over `--repeats`.

    .venv/bin/python benchmarks/serve.py                    # @champion of this checkout (after make demo)
    .venv/bin/python benchmarks/serve.py --model work/train/export --device cuda   # the same on a GPU box
    .venv/bin/python benchmarks/serve.py --smoke            # a random tiny model folder: seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from _bench import parse_args  # noqa: E402

THREE = ("The weather was calm when the boat left the harbour. By noon a light wind had filled the sails. "
         "We reached the island just before the sun went down.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> urllib.request.Request:
    return urllib.request.Request(f"{url}/v1/audio/speech", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"})


def whole(url: str, body: dict) -> tuple[float, float]:
    """(wall seconds, audio seconds) of one non-streamed WAV."""
    import io

    import soundfile as sf

    start = time.perf_counter()
    with urllib.request.urlopen(post(url, {**body, "response_format": "wav"}), timeout=600) as r:
        data = r.read()
    wall = time.perf_counter() - start
    info = sf.info(io.BytesIO(data))
    return wall, info.frames / info.samplerate


def streamed(url: str, body: dict) -> tuple[float, float, int]:
    """(first byte s, last byte s, chunks) of the same input as streamed pcm."""
    start = time.perf_counter()
    first, chunks = None, 0
    with urllib.request.urlopen(post(url, {**body, "response_format": "pcm"}), timeout=600) as r:
        while r.read1(1 << 16):
            first = first if first is not None else time.perf_counter() - start
            chunks += 1
    return first or 0.0, time.perf_counter() - start, chunks


def serve(model: str, device: str, work: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = [str(Path(sys.executable).with_name("voxpipe")), "serve", "--model", model, "--port", str(port),
            "--device", device, "--voices", str(work / "voices")]
    env = {k: v for k, v in os.environ.items() if k != "VOXPIPE_API_KEY"}
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=(work / "serve.log").open("w"), env=env,
                            start_new_session=True, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"voxpipe serve exited: {(work / 'serve.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.3)
    proc.kill()
    sys.exit("voxpipe serve did not become ready in 600 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="@champion", help="what `voxpipe serve --model` takes")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--inference-timesteps", type=int, default=10)
    parser.add_argument("--tiny", action="store_true", help="serve a random-init tiny model folder")
    args = parse_args(parser, tiny=True, repeats=1, inference_timesteps=2, device="cpu")
    with tempfile.TemporaryDirectory(prefix="voxpipe-bench-serve-") as tmp:
        work = Path(tmp)
        model = args.model
        if args.tiny:
            from voxpipe.steps.model import ModelParams
            from voxpipe.train.init_model import init_model

            init_model(ModelParams(preset="tiny", out=str(work / "tiny")))
            model = str(work / "tiny")
        proc, url = serve(model, args.device, work)
        try:
            body = {"model": "voxpipe", "input": THREE, "voice": "default",
                    "inference_timesteps": args.inference_timesteps}
            whole(url, body)  # warm-up: first-call costs are not the server's speed
            fulls, streams = [], []
            for _ in range(args.repeats):
                fulls.append(whole(url, body))
                streams.append(streamed(url, body))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    full_s = statistics.median(f[0] for f in fulls)
    audio_s = statistics.median(f[1] for f in fulls)
    first_s = statistics.median(s[0] for s in streams)
    ratio = first_s / full_s if full_s else None
    print(json.dumps({
        "model": "random tiny (smoke)" if args.tiny else model, "device": args.device,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "input_chars": len(THREE), "sentences": 3, "repeats": args.repeats,
        "inference_timesteps": args.inference_timesteps,
        "full_s": round(full_s, 3), "audio_s": round(audio_s, 3),
        "real_time_factor": round(full_s / audio_s, 3) if audio_s else None,
        "stream_first_byte_s": round(first_s, 3),
        "stream_total_s": round(statistics.median(s[1] for s in streams), 3),
        "stream_chunks": min(s[2] for s in streams),
        "first_chunk_over_full": round(ratio, 3) if ratio is not None else None,
        "first_chunk_within_half": ratio is not None and ratio <= 0.5,
    }))


if __name__ == "__main__":
    main()
