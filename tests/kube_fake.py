"""A local stand-in for the few Kubernetes API calls `voxpipe launch-train` makes.

No API server, container engine or kind/k3s/envtest runs on these machines, so the submit/watch
code is exercised through the official kubernetes client against this HTTP server on 127.0.0.1:
create/get/delete of a Volcano Job or a Kubeflow Trainer TrainJob (status scripted per test), a merge patch
of a TrainJob's status (what a training pod reports), create
of a TrainingRuntime, list pods by label, and a pod's log with tailLines. It checks what a real
server would reject in these calls (wrong paths, a missing name, bad label selectors, a kind posted
to another kind's path); it runs no controller.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

JOBS = re.compile(r"^/apis/(batch\.volcano\.sh|trainer\.kubeflow\.org)/v1alpha1/namespaces/([a-z0-9-]+)/"
                  r"(jobs|trainjobs|trainingruntimes)(?:/([a-z0-9.-]+))?(/status)?$")
# the kind each path takes, and the label its controller puts on the job's pods
KINDS = {("batch.volcano.sh", "jobs"): ("Job", "volcano.sh/job-name"),
         ("trainer.kubeflow.org", "trainjobs"): ("TrainJob", "jobset.sigs.k8s.io/jobset-name"),
         ("trainer.kubeflow.org", "trainingruntimes"): ("TrainingRuntime", None)}
PODS = re.compile(r"^/api/v1/namespaces/([a-z0-9-]+)/pods$")
LOG = re.compile(r"^/api/v1/namespaces/([a-z0-9-]+)/pods/([a-z0-9.-]+)/log$")


@dataclass
class FakeCluster:
    """Scripted cluster state. `statuses`: the job's `status` on successive GETs (the last repeats)."""

    statuses: list[dict[str, Any]] = field(default_factory=lambda: [{"state": {"phase": "Completed"}}])
    pods: list[dict[str, Any]] = field(default_factory=list)  # label volcano.sh/job-name filled in
    logs: dict[str, str] = field(default_factory=dict)  # pod name -> full log
    create_error: int | None = None
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    runtimes: dict[str, dict[str, Any]] = field(default_factory=dict)  # TrainingRuntimes by name
    deleted: list[str] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    status_patches: list[dict[str, Any]] = field(default_factory=list)  # bodies of status merge patches
    patch_error: int | None = None  # answer every status patch with this code (403: RBAC missing)
    _gets: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeCluster:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # --- the API ---------------------------------------------------------------------------------

    def create_job(self, group: str, plural: str, namespace: str,
                   body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.create_error:
            return self.create_error, _status(self.create_error, "scripted failure")
        meta = body.get("metadata", {})
        kind, pod_label = KINDS[(group, plural)]
        if body.get("kind") != kind or body.get("apiVersion") != f"{group}/v1alpha1":
            return 400, _status(400, f"not a {group}/v1alpha1 {kind}")
        if plural == "trainingruntimes":
            if not meta.get("name"):
                return 422, _status(422, "name is required")
            if meta["name"] in self.runtimes:
                return 409, _status(409, f'trainingruntimes "{meta["name"]}" already exists')
            self.runtimes[meta["name"]] = body
            return 201, body
        if meta.get("namespace", namespace) != namespace:
            return 400, _status(400, "the object's namespace does not match the request's")
        name = meta.get("name") or (meta.get("generateName", "") + f"{len(self.jobs):05d}")
        if not name:
            return 422, _status(422, "name or generateName is required")
        if name in self.jobs:
            return 409, _status(409, f'jobs.batch.volcano.sh "{name}" already exists')
        created = json.loads(json.dumps(body))
        created["metadata"] = {**meta, "name": name, "namespace": namespace, "uid": f"uid-{name}"}
        self.jobs[name] = created
        for pod in self.pods:
            pod["metadata"].setdefault("labels", {})[pod_label] = name
        return 201, created

    def get_job(self, name: str) -> tuple[int, dict[str, Any]]:
        if name not in self.jobs:
            return 404, _status(404, f'jobs.batch.volcano.sh "{name}" not found')
        status = self.statuses[min(self._gets, len(self.statuses) - 1)]
        self._gets += 1
        if "http_error" in status:  # a transient API-server failure for this GET
            return status["http_error"], _status(status["http_error"], "scripted")
        return 200, {**self.jobs[name], "status": status}

    def delete_job(self, name: str) -> tuple[int, dict[str, Any]]:
        if self.jobs.pop(name, None) is None:
            return 404, _status(404, f'jobs.batch.volcano.sh "{name}" not found')
        self.deleted.append(name)
        return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    def patch_status(self, name: str, content_type: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """A merge patch of a TrainJob's status subresource, as the API server takes it from a pod."""
        if self.patch_error:
            return self.patch_error, _status(self.patch_error, "scripted failure")
        if content_type != "application/merge-patch+json":
            return 415, _status(415, f"the server does not take {content_type} here")
        if name not in self.jobs:
            return 404, _status(404, f'trainjobs.trainer.kubeflow.org "{name}" not found')
        if set(body) != {"status"}:
            return 422, _status(422, "a status patch changes only .status")
        self.status_patches.append(body)
        job = self.jobs[name]
        job["status"] = {**job.get("status", {}), **body["status"]}
        return 200, job

    def list_pods(self, selector: str) -> tuple[int, dict[str, Any]]:
        key, sep, value = selector.partition("=")
        if not sep or not key:
            return 400, _status(400, f"unable to parse requirement: {selector!r}")
        items = [p for p in self.pods if p["metadata"].get("labels", {}).get(key) == value]
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}

    def pod_log(self, pod: str, tail: int | None) -> tuple[int, str]:
        if pod not in self.logs:
            return 404, json.dumps(_status(404, f'pods "{pod}" not found'))
        lines = self.logs[pod].splitlines(keepends=True)
        return 200, "".join(lines[-tail:] if tail else lines)


def _status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}


def _handler(cluster: FakeCluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
            pass

        def _reply(self, code: int, body: dict[str, Any] | str) -> None:
            text = body if isinstance(body, str) else json.dumps(body)
            data = text.encode()
            self.send_response(code)
            ctype = "text/plain" if isinstance(body, str) and code == 200 else "application/json"
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with cluster._lock:
                cluster.requests.append((method, url.path))
                if m := JOBS.match(url.path):
                    group, namespace, plural, name, status = m.groups()
                    if method == "PATCH" and name and status and plural == "trainjobs":
                        content_type = self.headers.get("Content-Type", "")
                        return self._reply(*cluster.patch_status(name, content_type, json.loads(body)))
                    if status:
                        return self._reply(405, _status(405, f"{method} of a status subresource"))
                    if method == "POST" and name is None:
                        return self._reply(*cluster.create_job(group, plural, namespace, json.loads(body)))
                    if method == "GET" and name:
                        return self._reply(*cluster.get_job(name))
                    if method == "DELETE" and name:
                        return self._reply(*cluster.delete_job(name))
                if method == "GET" and PODS.match(url.path):
                    return self._reply(*cluster.list_pods(query.get("labelSelector", [""])[0]))
                if method == "GET" and (m := LOG.match(url.path)):
                    tail = int(query["tailLines"][0]) if "tailLines" in query else None
                    return self._reply(*cluster.pod_log(m.group(2), tail))
            self._reply(404, _status(404, f"no route {method} {url.path}"))

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_DELETE(self) -> None:
            self._route("DELETE")

        def do_PATCH(self) -> None:
            self._route("PATCH")

    return Handler


def pod(name: str, task: str, phase: str, exit_code: int | None = None, finished: str | None = None,
        reason: str | None = None, waiting: tuple[str, str] | None = None) -> dict[str, Any]:
    """A pod as the API returns it; `exit_code` makes its container terminated, `waiting` (reason,
    message) keeps it from starting."""
    status: dict[str, Any] = {"phase": phase}
    if waiting:
        status["containerStatuses"] = [
            {"name": "train", "ready": False, "restartCount": 0, "image": "voxpipe", "imageID": "",
             "state": {"waiting": {"reason": waiting[0], "message": waiting[1]}}}
        ]
    if reason:
        status["reason"] = reason
    if exit_code is not None:
        term: dict[str, Any] = {"exitCode": exit_code, "reason": "Error" if exit_code else "Completed"}
        if finished:
            term["finishedAt"] = finished
        status["containerStatuses"] = [
            {"name": "train", "ready": False, "restartCount": 0, "image": "voxpipe", "imageID": "",
             "state": {"terminated": term}}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        # Volcano's task label; a JobSet pod's completion index (rank 0 for the master)
        "metadata": {"name": name, "namespace": "ml", "labels": {
            "volcano.sh/task-spec": task,
            "batch.kubernetes.io/job-completion-index": "0" if task == "master" else "1"}},
        "spec": {"containers": [{"name": "train", "image": "voxpipe"}]},
        "status": status,
    }
