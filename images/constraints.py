"""Print the exact versions of voxpipe's runtime dependencies installed in this environment.

The images install with `pip install --constraint images/constraints.txt`, so a build gets the
versions the test suite ran with, not whatever PyPI serves that day. After changing dependencies,
`make generate` rewrites it (tools/generate.py runs
`.venv/bin/python images/constraints.py > images/constraints.txt`).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = "voxpipe"
# what the images install: `pip install ".[cluster,eval]"`. Resemblyzer, installed beside it --no-deps,
# is pinned in the Dockerfiles; what it imports comes with the eval extra (tests/test_images.py checks)
EXTRAS = frozenset({"cluster", "eval"})


def runtime_closure(root: str = ROOT, extras: frozenset[str] = EXTRAS) -> dict[str, str]:
    """name -> installed version of everything `root[extras]` pulls in, markers evaluated here."""
    pins: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(root, extras)]
    while todo:
        name, wanted = todo.pop()
        key = canonicalize_name(name)
        if (key, wanted) in seen:
            continue
        seen.add((key, wanted))
        dist = distribution(name)
        if key != canonicalize_name(root):
            # the local label (2.13.0+cpu) names the wheel index, not the version: each image picks its own
            pins[key] = Version(dist.version).public
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (*wanted, "")):
                continue
            try:
                distribution(req.name)
            except PackageNotFoundError:
                raise SystemExit(f"{req.name} (needed by {name}) is not installed here") from None
            todo.append((req.name, frozenset(req.extras)))
    return pins


def main() -> None:
    extras = ",".join(sorted(EXTRAS))
    print(f"# written by images/constraints.py from the test environment: {ROOT}[{extras}]")
    for name, version in sorted(runtime_closure().items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
