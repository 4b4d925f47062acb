"""`voxpipe serve` under many listeners at once, beside upstream voxcpm's `generate`; prints JSON.

Starts `voxpipe serve` (a subprocess on 127.0.0.1) with a batch of the largest level's rows and waits for
/ready, and warms it up with one untimed pass. Then, for each level of `--concurrency` (closed loop: that
many clients, each sending its next request as soon as its last one ends), the same work: each of TEXTS
(fixed, of mixed length, one to three sentences) `--rounds` times, as streamed `pcm` answers:
- requests/s and seconds of audio per wall second;
- time to the first byte, p50 and p95; the real-time factor (a request's wall seconds per audio second), p50;
- the server's peak resident memory during the level, and the CPU seconds it spent per second of audio
  (all its threads and its finishing processes: a figure the machine's other load changes far less than
  the wall-clock ones).
`threads` is what the server set torch's threads to (its /metrics: voxpipe_torch_threads).

`upstream` is voxcpm 2.0.3's `VoxCPM2Model.generate` on the same weights (a checkpoint folder) in this
process, one request at a time (it has no batch path), with as many torch threads as the server's
generation: its requests/s, audio per wall second, real-time factor and, from `generate_streaming`, its
first chunk. Null with the reason without upstream voxcpm or a checkpoint folder.

`--watermark` is the server's synthesize.watermark (perth, its default, marks every sentence; off measures
generation alone). `--neighbours N` runs only the neighbours check instead: N other torch processes busy
with matmuls on torch's default threads (as neighbour pods would be), and meanwhile each text, one at a time,
as a non-streamed WAV from the warm server and as in-process `generate` of the same sentences (the
server's rows: its normalized text split the server's way, each sentence's sized max_len, the same seed)
on one torch thread; it prints the ratio of the two's wall seconds. The neighbours are killed when the check
ends, however it ends (their process group; each also exits once its parent is gone).

    .venv/bin/python benchmarks/serve.py --model work/train/export            # the demo's export, on CPU
    .venv/bin/python benchmarks/serve.py --model /path/to/export --device cuda --concurrency 1,16
    .venv/bin/python benchmarks/serve.py --model work/train/export --neighbours 2
    .venv/bin/python benchmarks/serve.py --smoke            # a random tiny model folder: seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from _bench import nulls, parse_args  # noqa: E402

TEXTS = (
    "Good morning.",
    "The weather was calm when the boat left the harbour.",
    "Please hold the line. Your call is important to us.",
    "By noon a light wind had filled the sails, and the island rose slowly out of the haze ahead of us.",
    "Thanks!",
    "We reached the island just before the sun went down. The harbour master waved us in. Dinner was late.",
    "Turn left at the second light, then keep going for about two hundred metres.",
    "Yes. No. Maybe tomorrow.",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def streamed(url: str, body: dict) -> tuple[float, float, float]:
    """(first byte s, last byte s, audio s) of one streamed pcm answer (16-bit mono)."""
    request = urllib.request.Request(f"{url}/v1/audio/speech", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first, size = None, 0
    with urllib.request.urlopen(request, timeout=600) as r:
        rate = int(r.headers["X-Sample-Rate"])
        while chunk := r.read1(1 << 16):
            first = first if first is not None else time.perf_counter() - start
            size += len(chunk)
    return first or 0.0, time.perf_counter() - start, size / 2 / rate


def whole(url: str, body: dict) -> float:
    """Wall seconds of one non-streamed WAV answer."""
    data = json.dumps({**body, "response_format": "wav"}).encode()
    request = urllib.request.Request(f"{url}/v1/audio/speech", data=data,
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as r:
        r.read()
    return time.perf_counter() - start


def serve(model: str, device: str, rows: int, work: Path, watermark: str = "perth"
          ) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = [str(Path(sys.executable).with_name("voxpipe")), "serve", "--model", model, "--port", str(port),
            "--device", device, "--voices", str(work / "voices"), "--concurrency", str(rows),
            "--queue", str(rows), "--set", f"synthesize.watermark={watermark}"]
    if watermark == "off":
        args += ["--set", "synthesize.watermark_off_reason=benchmarks/serve.py --watermark off (generation "
                 "alone)"]
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


class PeakRss:
    """The largest resident memory of a process and its children (the server's finishing processes)
    together, sampled every 0.1 s while the block runs."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.process, self.peak, self.stop = psutil.Process(pid), 0, threading.Event()

    def __enter__(self) -> PeakRss:
        def sample() -> None:
            while not self.stop.wait(0.1):
                tree = (self.process, *self.process.children(recursive=True))
                self.peak = max(self.peak, sum(p.memory_info().rss for p in tree))

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.stop.set()
        self.thread.join()


def tree_cpu(process) -> float:
    """CPU seconds (user and system) of a process and its children: the server's finishing processes."""
    return sum(sum(p.cpu_times()[:2]) for p in (process, *process.children(recursive=True)))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def level(url: str, pid: int, clients: int, rounds: int, body: dict) -> dict:
    """`clients` closed-loop clients sharing the same work at every level: each text `rounds` times, taken
    in order by whichever client is free."""
    work = [(TEXTS[i % len(TEXTS)], i) for i in range(rounds * len(TEXTS))]
    results: list[tuple[float, float, float]] = []
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if not work:
                    return
                text, seed = work.pop(0)
            got = streamed(url, {**body, "input": text, "seed": seed})
            with lock:
                results.append(got)

    with PeakRss(pid) as rss:
        cpu = tree_cpu(rss.process)
        start = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        cpu = tree_cpu(rss.process) - cpu
    audio = sum(r[2] for r in results)
    return {"requests": len(results), "wall_s": round(wall, 3),
            "requests_per_s": round(len(results) / wall, 3), "audio_s_per_wall_s": round(audio / wall, 3),
            "ttfb_p50_s": round(pct([r[0] for r in results], 0.5), 3),
            "ttfb_p95_s": round(pct([r[0] for r in results], 0.95), 3),
            "rtf_p50": round(statistics.median(r[1] / r[2] for r in results if r[2] > 0), 3),
            "server_cpu_s_per_audio_s": round(cpu / audio, 4) if audio else None,
            "peak_rss_mb": round(rss.peak / 2**20, 1)}


def server_threads(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        page = r.read().decode()
    found = re.findall(r'^voxpipe_torch_threads\{kind="(\w+)"\} (\S+)$', page, re.M)
    return {k: int(float(v)) for k, v in found}


def upstream(folder: Path | None, device: str, threads: int, rounds: int, gen: dict) -> dict:
    """upstream voxcpm's generate on the same checkpoint, one request at a time, each text `rounds` times."""
    keys = ("requests_per_s", "audio_s_per_wall_s", "rtf_p50", "ttfb_p50_s")
    if folder is None:
        return nulls(keys, "--model is not a checkpoint folder, which upstream's from_local needs")
    try:
        from upstream import load_upstream

        load_upstream()
        from voxcpm.model.voxcpm2 import VoxCPM2Model
    except ImportError as e:
        return nulls(keys, str(e))
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = VoxCPM2Model.from_local(str(folder), optimize=False, training=False,
                                        device="cuda" if device == "cuda" else "cpu")
        rate = model.sample_rate
        model.generate(TEXTS[0], **gen)  # warm-up
        walls, audio, firsts = [], [], []
        for _ in range(rounds):
            for text in TEXTS:
                torch.manual_seed(0)
                start = time.perf_counter()
                wav = model.generate(text, **gen)
                walls.append(time.perf_counter() - start)
                audio.append(wav.shape[-1] / rate)
                start = time.perf_counter()
                chunks = model.generate_streaming(text, **gen)
                next(chunks)
                firsts.append(time.perf_counter() - start)
                chunks.close()
    finally:
        torch.set_num_threads(before)
    return {"requests": len(walls), "requests_per_s": round(len(walls) / sum(walls), 3),
            "audio_s_per_wall_s": round(sum(audio) / sum(walls), 3),
            "rtf_p50": round(statistics.median(w / a for w, a in zip(walls, audio, strict=True) if a > 0), 3),
            "ttfb_p50_s": round(statistics.median(firsts), 3), "torch_threads": threads}


NEIGHBOUR = """
import os, sys, torch
x = torch.randn(1024, 1024)
while os.getppid() == int(sys.argv[1]):  # its parent gone (killed past any finally): it goes too
    x @ x
"""


def neighbours_check(url: str, folder: Path | None, count: int, rounds: int, gen: dict) -> dict:
    """Non-streamed requests one at a time against the warm server, and the same sentences generated in
    this process on one torch thread, while `count` neighbour processes keep every core busy."""
    keys = ("served_s_p50", "in_process_s_p50", "ratio_p50", "ratio_total")
    if folder is None:
        return nulls(keys, "--model is not a checkpoint folder, which in-process generate needs")
    import torch

    from voxpipe.model.io import from_pretrained
    from voxpipe.serve.formats import sentences
    from voxpipe.serve.request import Limits, parse_request, sized_max_len

    model = from_pretrained(folder, device="cpu").eval()

    def in_process(text: str, seed: int) -> float:
        spoken = parse_request([text], [None], {}, Limits()).spoken[0]
        start = time.perf_counter()
        for sentence in sentences(spoken):
            model.generate(sentence, max_len=sized_max_len([sentence], gen.get("max_len")), seed=seed,
                           inference_timesteps=gen["inference_timesteps"])
        return time.perf_counter() - start

    before = torch.get_num_threads()
    procs = []
    try:
        procs = [subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(os.getpid())], start_new_session=True)
                 for _ in range(count)]
        torch.set_num_threads(1)
        served, local = [], []
        in_process(TEXTS[0], 0)  # warm-up
        for i in range(rounds * len(TEXTS)):
            text = TEXTS[i % len(TEXTS)]
            served.append(whole(url, {"model": "voxpipe", "voice": "default", "input": text, "seed": i,
                                      **gen}))
            local.append(in_process(text, i))
        load = os.getloadavg()[0]
    finally:
        torch.set_num_threads(before)
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    return {"neighbours": count, "requests": len(served), "load": round(load, 1),
            "served_s_p50": round(statistics.median(served), 3),
            "in_process_s_p50": round(statistics.median(local), 3),
            "ratio_p50": round(statistics.median(s / g for s, g in zip(served, local, strict=True)), 3),
            "ratio_total": round(sum(served) / sum(local), 3)}


def ratio(levels: dict, key: str, high: str, low: str = "1") -> float | None:
    if high in levels and low in levels and levels[low][key]:
        return round(levels[high][key] / levels[low][key], 3)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="work/train/export",
                        help="what `voxpipe serve --model` takes; a checkpoint folder also runs upstream")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--concurrency", default="1,2,4,8,16", help="the levels, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="times each text is said per level")
    parser.add_argument("--inference-timesteps", type=int, default=10)
    parser.add_argument("--max-len", type=int, default=None, help="patches at most (None: sized per text)")
    parser.add_argument("--tiny", action="store_true", help="serve a random-init tiny model folder")
    parser.add_argument("--watermark", default="perth", choices=["perth", "off"],
                        help="the server's synthesize.watermark (off: generation alone)")
    parser.add_argument("--neighbours", type=int, default=0,
                        help="run the neighbours check instead of the levels: this many busy torch processes")
    args = parse_args(parser, tiny=True, concurrency="1,2", rounds=1, inference_timesteps=2, max_len=6)
    levels_asked = [int(c) for c in args.concurrency.split(",")]
    gen = {"inference_timesteps": args.inference_timesteps}
    if args.max_len:
        gen["max_len"] = args.max_len
    with tempfile.TemporaryDirectory(prefix="voxpipe-bench-serve-") as tmp:
        work = Path(tmp)
        model = args.model
        if args.tiny:
            from voxpipe.steps.model import ModelParams
            from voxpipe.train.init_model import init_model

            init_model(ModelParams(preset="tiny", out=str(work / "tiny")))
            model = str(work / "tiny")
        folder = Path(model) if (Path(model) / "config.json").is_file() else None
        proc, url = serve(model, args.device, max(levels_asked), work, args.watermark)
        try:
            body = {"model": "voxpipe", "voice": "default", "response_format": "pcm", **gen}
            level(url, proc.pid, max(levels_asked), 1, body)  # warm-up: first calls of each shape are slow
            threads = server_threads(url)
            if args.neighbours:
                checked = neighbours_check(url, folder, args.neighbours, args.rounds, gen)
            else:
                levels = {str(c): level(url, proc.pid, c, args.rounds, body) for c in levels_asked}
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        if not args.neighbours:
            upstream_gen = {"inference_timesteps": args.inference_timesteps, "max_len": args.max_len or 2000}
            intra = threads.get("intra_op_threads", 1)
            reference = upstream(folder, args.device, intra, args.rounds, upstream_gen)
    head = {"model": "random tiny (smoke)" if args.tiny else model, "device": args.device,
            "machine": f"{platform.machine()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
            "texts": len(TEXTS), "rounds": args.rounds, **gen, "watermark": args.watermark,
            "threads": threads}
    if args.neighbours:
        print(json.dumps({**head, "neighbours": checked}))
        return
    throughput = ratio(levels, "requests_per_s", "8")
    ttfb = ratio(levels, "ttfb_p50_s", "8")
    figures = {"throughput_8_over_1": throughput, "ttfb_p50_8_over_1": ttfb}
    missing = [k for k, v in figures.items() if v is None]
    print(json.dumps({
        **head, "levels": levels, "upstream": reference,
        **{k: v for k, v in figures.items() if v is not None},
        **nulls(missing, "needs levels 1 and 8 (--concurrency)"),
    }))

if __name__ == "__main__":
    main()
