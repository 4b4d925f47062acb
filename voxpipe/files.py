"""The file helpers every layer needs, written once: a JSON object read with a one-paragraph error, a
file written whole or not at all, a file's digest, the `step-N` folders, a checkpoint's state dict.

A write goes to a temp file beside the target and is renamed over it, so a reader (another rank, DVC, a
resumed run after a kill) never sees a half-written file under the final name. Weights load only from
safetensors or through `torch.load(weights_only=True)`: a shared cluster's files are not trusted to
unpickle.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxpipe.errors import StepError

if TYPE_CHECKING:
    import torch

STEP_DIR = re.compile(r"^step-(\d+)$")  # checkpoints/step-N, exports/step-N
# a volume that takes no more (full, over quota, read-only, file too large): a step says so in one paragraph
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def as_os_error(e: BaseException, path: str | Path | None = None) -> BaseException:
    """`e`, or the OSError inside it: safetensors' Rust writer reports one as a SafetensorError
    ("I/O error: No space left on device (os error 28)"), so a full disk would not read as one."""
    if isinstance(e, OSError) or (m := _RUST_OS_ERROR.search(str(e))) is None:
        return e
    code = int(m.group(1))
    return OSError(code, os.strerror(code), *([str(path)] if path is not None else []))


def step_folders(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every `step-N` folder under root, oldest first (none when root is absent)."""
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), child) for child in root.iterdir() if (m := STEP_DIR.match(child.name)))


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from `path`; a StepError naming the file and `what` it should have been otherwise."""
    path = Path(path)
    if not path.is_file():
        raise StepError(f"{path}: {what} not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StepError(f"{path}: cannot read {what}: {e}") from e
    if not isinstance(data, dict):
        raise StepError(f"{path}: {what} must be a JSON object")
    return data


def atomic_write(path: Path, write: Callable[[str], object], suffix: str = "") -> None:
    """`write(tmp)` writes the file at the temp path `tmp`; then it replaces `path` in one rename. On any
    error (Ctrl-C too) the temp file goes and `path` is as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file + rename so readers never see a half-written file."""
    atomic_write(Path(path), lambda tmp: Path(tmp).write_text(text))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """The hex digest of a file, read in chunks (md5: as DVC computes it, not for security)."""
    make = (lambda: hashlib.md5(usedforsecurity=False)) if algorithm == "md5" else algorithm
    with open(path, "rb") as f:
        return hashlib.file_digest(f, make).hexdigest()


def read_state_dict(path: Path, what: str) -> dict[str, torch.Tensor]:
    """Tensors by name from a .safetensors file, or a torch file through `torch.load(weights_only=True)`
    (its tensors maybe nested under "state_dict"), on CPU. A StepError names a file that cannot be read
    (truncated or corrupt: safetensors and torch raise their own types) or holds something else."""
    import torch

    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise StepError(f"{path}: cannot read {what} ({e}); the file is truncated or corrupt: copy it again "
                        "from where it came from") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise StepError(f"{path}: {what} is not a state dict (expected a mapping of names to tensors)")
    return state
