"""The Prometheus page of `voxpipe serve` (/metrics): requests, errors, latency, audio seconds made and the
real-time factor (seconds of compute per second of audio: below 1 is faster than real time), the batch's rows
per patch and how long rows waited to join it; the request figures are labelled with
the served model version, the adapter's hash and the voice (a bounded set: the model's and the added
voices, `reference` for a clip sent with the request, `default` for none). One registry per app, so two
servers in one process (the tests) count apart."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

LABELS = ("version", "adapter", "voice")
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100)
RTF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes and CPU seconds: does memory stay flat
        self.requests = Counter("voxpipe_requests", "HTTP requests answered", ("route", "status"), registry=r)
        self.errors = Counter("voxpipe_request_errors", "requests refused or stopped, by kind",
                              ("route", "kind"), registry=r)
        self.latency = Histogram("voxpipe_request_seconds", "time from request to the last byte",
                                 ("route",), buckets=LATENCY_BUCKETS, registry=r)
        self.first_byte = Histogram("voxpipe_speech_first_byte_seconds", "time to the first audio byte",
                                    LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.audio = Counter("voxpipe_audio_seconds", "seconds of audio made", LABELS, registry=r)
        self.rtf = Histogram("voxpipe_real_time_factor", "compute seconds per audio second of a request",
                             LABELS, buckets=RTF_BUCKETS, registry=r)
        self.model = Gauge("voxpipe_served_model", "1 for the served model version and its adapter",
                           ("version", "adapter"), registry=r)
        self.batch_size = Histogram("voxpipe_batch_rows", "rows of the batch at each generated patch "
                                    "(serve.concurrency at most)", buckets=BATCH_BUCKETS, registry=r)
        self.queue_wait = Histogram("voxpipe_queue_wait_seconds", "seconds a row waited to join the batch (a "
                                    "request's first sentence: from its arrival, the waiting room included)",
                                    buckets=WAIT_BUCKETS, registry=r)
        self.threads = Gauge("voxpipe_torch_threads", "torch's threads (intra_op_threads, inter_op_threads) "
                             "and the usable_cores they were sized by (voxpipe/cores.py)", ("kind",),
                             registry=r)
        self.in_flight = Gauge("voxpipe_speech_in_flight", "speech requests admitted (generating or waiting)",
                               registry=r)

    def spoken(self, labels: dict[str, str], audio_seconds: float, compute_seconds: float) -> None:
        self.audio.labels(**labels).inc(audio_seconds)
        if audio_seconds > 0:
            self.rtf.labels(**labels).observe(compute_seconds / audio_seconds)

    def page(self) -> bytes:
        return generate_latest(self.registry)
