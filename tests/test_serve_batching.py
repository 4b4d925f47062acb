"""Issue 46 part 1: `voxpipe serve` batches requests as they arrive. A burst up to the waiting room gets
answers, not 429s; past it a 429; a gone client's row leaves the batch at its next patch and frees its slot
while its batch-mate goes on, and a new request joins the running batch and is answered before it ends.

One real server: the runaway tiny checkpoint of test_serve_hostile (its stop head never fires, so a long
request runs for minutes), 2 rows per batch, a waiting room of 4; the client is OpenAI's own. No test times
the server: a held slot shows as the next request's client timing out.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
from servers import free_port, serving
from test_serve import KEY, get
from test_serve_hostile import LONG, SHORT, in_flight, metric, runaway_checkpoint, send_speech, wait_for

from voxpipe.cores import usable_cores
from voxpipe.serve.batcher import DECODING_STREAMS

ROWS, ROOM = 2, 4


@pytest.fixture(scope="module")
def batching_server(tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("batching")
    model = runaway_checkpoint(root / "runaway")
    port = free_port()
    args = [str(Path(sys.executable).with_name("voxpipe")), "serve", "--model", str(model),
            "--port", str(port), "--voices", str(root / "voices"), "--device", "cpu",
            "--concurrency", str(ROWS), "--queue", str(ROOM), "--synthesize-deadline-s", "3600",
            "--set", "serve.batch_window_ms=200"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["VOXPIPE_API_KEY"] = KEY
    url = f"http://127.0.0.1:{port}"
    with serving(args, f"{url}/health", root / "serve.log", env, cwd=root):
        for _ in range(800):
            if get(url, "/ready")[0] == 200:
                break
            time.sleep(0.3)
        yield url
    log = (root / "serve.log").read_text()
    assert "Traceback" not in log, log[-3000:]


def speak(url: str, text: str) -> bytes:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120).audio.speech.create(
        model="m", voice="default", input=text, extra_body=SHORT).read()


def batch_rows(url: str) -> tuple[float, float]:
    """(patches generated with one row in the batch, patches generated in all)."""
    return (metric(url, r'^voxpipe_batch_rows_bucket\{le="1.0"\} (\S+)$'),
            metric(url, r"^voxpipe_batch_rows_count (\S+)$"))


def test_a_burst_up_to_the_waiting_room_is_answered_and_past_it_a_429(batching_server):
    url = batching_server
    with ThreadPoolExecutor(ROWS + ROOM) as pool:
        answers = list(pool.map(lambda i: speak(url, f"Burst request number {i}."), range(ROWS + ROOM)))
    assert all(a[:4] == b"RIFF" for a in answers)
    alone, patches = batch_rows(url)
    assert alone < patches, "every patch was made for one row: the requests were not batched"
    assert metric(url, r"^voxpipe_queue_wait_seconds_count (\S+)$") >= ROWS + ROOM
    cores = usable_cores()  # the server's threads: sized by them, one core left for the event loop, the rest
    # split between generating and decoding
    assert metric(url, r'^voxpipe_torch_threads\{kind="usable_cores"\} (\S+)$') == cores
    intra = max(1, (cores - 1) // DECODING_STREAMS)
    assert metric(url, r'^voxpipe_torch_threads\{kind="intra_op_threads"\} (\S+)$') == intra

    held = [send_speech(url_port(url), LONG) for _ in range(ROWS + ROOM)]
    try:
        wait_for(lambda: in_flight(url) == ROWS + ROOM)
        with pytest.raises(openai.RateLimitError, match="serve.concurrency, serve.queue"):
            speak(url, "One too many.")
    finally:
        for s in held:
            s.close()
    wait_for(lambda: in_flight(url) == 0)


def test_a_gone_clients_row_frees_its_slot_and_a_new_row_joins_the_running_batch(batching_server):
    url = batching_server
    stays, leaves = send_speech(url_port(url), LONG), send_speech(url_port(url), LONG)
    try:
        wait_for(lambda: in_flight(url) == 2)
        _, before = batch_rows(url)
        wait_for(lambda: batch_rows(url)[1] > before + 2)  # a few patches of both rows
        leaves.close()
        wait_for(lambda: in_flight(url) == 1)  # its row left at its next patch: the slot is free
        alone_before, patches_before = batch_rows(url)
        assert speak(url, "A newcomer.")[:4] == b"RIFF"  # answered while the long row still runs
        assert in_flight(url) == 1
        alone_after, patches_after = batch_rows(url)
        assert patches_after - patches_before > alone_after - alone_before, "the newcomer never had company"
    finally:
        stays.close()
        leaves.close()
    wait_for(lambda: in_flight(url) == 0)


def url_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# --- threads sized by the cores the process may use (no server) ---

SIZED = """
import json, os, sys
from pathlib import Path
from voxpipe.cores import use_cores
out = []
for affinity, cpu_max, loop, streams in json.loads(sys.argv[1]):
    os.sched_getaffinity = lambda pid, n=affinity: set(range(n))  # a 64-core node's affinity, say
    out.append(use_cores(event_loop=loop == "loop", streams=streams, cpu_max=Path(cpu_max)))
print(json.dumps(out))
"""
SERVE = DECODING_STREAMS  # the server: generating and decoding threads beside the event loop
CASES = [  # affinity, cgroup cpu.max, an event loop or not, torch threads at once -> usable cores, intra-op
    (64, "900000 100000", "loop", SERVE, 9, 4),  # a pod of 9 CPUs on a 64-core node: 4 + 4 + the loop's
    (64, "400000 100000", "alone", 1, 4, 4),  # synthesize: no event loop, one thread runs torch
    (6, "max 100000", "loop", SERVE, 6, 2),  # no quota: the affinity
    (64, "50000 100000", "loop", SERVE, 1, 1),  # half a CPU: one thread each, whatever is left
    (2, "max 100000", "loop", SERVE, 2, 1),  # this machine
]


def test_torch_threads_follow_the_usable_cores_not_the_nodes(tmp_path):
    import json
    import subprocess

    asked = []
    for i, (affinity, quota, loop, streams, _, _) in enumerate(CASES):
        (tmp_path / f"cpu.max.{i}").write_text(quota + "\n")
        asked.append((affinity, str(tmp_path / f"cpu.max.{i}"), loop, streams))
    done = subprocess.run([sys.executable, "-c", SIZED, json.dumps(asked)], capture_output=True, text=True,
                          timeout=120, check=True)
    expected = [{"usable_cores": usable, "intra_op_threads": intra, "inter_op_threads": 1}
                for *_, usable, intra in CASES]
    assert json.loads(done.stdout) == expected


# --- the finishing threads (in process: a tiny model, the batcher's own threads) ---

def test_a_requests_first_sentence_is_finished_before_later_ones_that_left_earlier(tiny_model):
    """Both finishing threads held in their marks (the second takes first sentences, and anything while the
    generating thread is idle); a request of two sentences leaves them both in the queue (its second joined
    when its first left the batch), then another request's first sentence; when one thread goes on, it
    finishes both first sentences before the later one that left earlier. Rows of 2, 3 and 4 patches tell
    the marks apart."""
    import threading

    from voxpipe.serve.batcher import Batcher
    from voxpipe.serve.deadline import Deadline
    from voxpipe.serve.request import Limits, parse_request

    gates = [threading.Event(), threading.Event()]
    marked: list[int] = []  # the patches of each marked row, in the order they were marked

    def mark(audio, rate):
        call = len(marked)
        marked.append(audio.size // (tiny_model.patch_size * tiny_model.audio_vae.decode_hop_length))
        if call < len(gates):  # the first two finishes hold both finishing threads
            assert gates[call].wait(120)
        return audio + 1.0  # what the batcher hands back is what the mark made

    def finish(patches):
        audio, _ = tiny_model.decode(patches)
        return mark(audio.numpy(), tiny_model.audio_vae.out_sample_rate)

    batcher = Batcher(tiny_model, max_rows=4, window_s=0.0, finish=[finish, finish])
    said: dict[str, object] = {}

    def say(name: str, patches: int, sentences: int = 1) -> threading.Thread:
        request = parse_request(["Some words."], [None], {"max_len": patches, "inference_timesteps": 1},
                                Limits())
        t = threading.Thread(target=lambda: said.setdefault(name, [f.result() for f in batcher.submit(
            request, ["Some words."] * sentences, Deadline(600))][-1]))
        t.start()
        return t

    threads = [say("held-1", 2), say("held-2", 2)]
    wait_for(lambda: len(marked) == 2)  # the second finisher took the second row (a first sentence)
    threads.append(say("two sentences", 3, sentences=2))
    wait_for(lambda: len(batcher._finishing) == 2)
    threads.append(say("first", 4))
    wait_for(lambda: len(batcher._finishing) == 3)
    gates[0].set()
    wait_for(lambda: len(marked) == 5)
    gates[1].set()
    for t in threads:
        t.join(120)
    assert marked == [2, 2, 3, 4, 3]
    alone = tiny_model.generate("Some words.", max_len=4, inference_timesteps=1, seed=0).audio[0].numpy()
    assert abs(said["first"] - (alone + 1.0)).max() <= 1e-4  # decoded, then marked


# --- the finishing processes (finishing.py): the same audio as the thread's own, and a dead one replaced ---

@pytest.mark.slow
def test_a_finishing_process_answers_as_the_thread_would_and_one_that_dies_fails_only_its_row(tiny_model):
    import threading

    import psutil
    import torch

    from voxpipe.errors import StepError
    from voxpipe.evaluate import marks
    from voxpipe.serve.finishing import FINISHING_NICE, FinishingProcess

    rate = tiny_model.audio_vae.out_sample_rate
    patches = 0.5 * torch.randn(9, tiny_model.patch_size, tiny_model.feat_dim,
                                generator=torch.Generator().manual_seed(0))
    finisher = FinishingProcess(tiny_model, "perth", 1, 0)
    finisher.ready()
    assert psutil.Process(finisher._process.pid).nice() == os.nice(0) + FINISHING_NICE  # generation first
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the worker's: bfloat16's rounding depends on how a sum is split
    try:
        audio, _ = tiny_model.decode(patches)
        expected = marks.mark(audio.numpy(), rate)
    finally:
        torch.set_num_threads(threads)
    got = finisher(patches)
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert abs(got - expected).max() <= 1e-4

    long = patches.repeat(200, 1, 1)  # minutes of audio: the worker is busy with it when it is killed
    threading.Timer(1.0, finisher._process.kill).start()
    with pytest.raises(StepError, match=r"voxpipe-finishing-0\) ended with exit code -9"):
        finisher(long)
    assert abs(finisher(patches) - expected).max() <= 1e-4  # the next row: a new worker
    finisher._process.kill()


# --- benchmarks/serve.py --neighbours: the neighbour processes never outlive the check ---

def _with_marker(marker: str, what: str) -> list:
    """This test's processes (they carry its marker in their environment) whose command line has `what`."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if what in " ".join(p.info["cmdline"] or []) and p.environ().get("VOXPIPE_TEST_MARKER") == marker:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


@pytest.mark.slow
def test_the_neighbours_check_prints_its_ratio_and_leaves_no_neighbour_running(tmp_path):
    import json
    import subprocess

    marker = f"neighbours-{os.getpid()}-{time.time_ns()}"
    env = {**os.environ, "VOXPIPE_TEST_MARKER": marker}
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "serve.py"
    command = [sys.executable, str(script), "--smoke", "--neighbours", "2"]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        checked = json.loads(done.stdout)["neighbours"]
        assert checked["neighbours"] == 2 and checked["requests"] == 8
        assert checked["ratio_p50"] > 0 and checked["ratio_total"] > 0
        assert not _with_marker(marker, "getppid")  # killed when the check ended

        killed = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: len(_with_marker(marker, "getppid")) == 2, tries=3000)
        killed.kill()  # past any finally
        killed.wait()
        wait_for(lambda: not _with_marker(marker, "getppid"))  # each saw its parent go
    finally:
        for p in _with_marker(marker, ""):  # the killed run's server, and anything else of this test's
            p.kill()
