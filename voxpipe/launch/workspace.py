"""Workspace paths on the cluster: relative to the PVC mount, never outside it.

Every pod of a run sees the shared volume at the same mount path and works in it, so a relative path
means the same folder in all of them. A path that leaves the mount (`../../etc/escape`, or an
absolute path elsewhere) would write where the other pods and a restarted job cannot see it, or
into the image. Checked lexically: the launcher cannot see the volume's symlinks.
"""

from __future__ import annotations

import posixpath

from voxpipe.errors import StepError


def inside_workspace(mount_path: str, key: str, path: str) -> str:
    """`path` resolved against the mount; a StepError naming `key` if it escapes the mount."""
    mount = posixpath.normpath(mount_path)
    resolved = posixpath.normpath(posixpath.join(mount, path))
    if resolved != mount and not resolved.startswith(mount.rstrip("/") + "/"):
        raise StepError(
            f"{key}={path!r} resolves to {resolved}, outside the workspace volume mounted at {mount_path}: "
            "the pods would not share it (checkpoint shards, resumes) and it could reach into the image or "
            f"other mounts. Use a path relative to the workspace (the working directory), e.g. "
            f"{key}=runs/my-run, or an absolute one under {mount_path}."
        )
    return resolved
