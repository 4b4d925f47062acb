"""A checkpoint folder that ships a SHA256SUMS file is checked against it before its files are read.

The demo's base (data/demo-base) lives in git. A damaged copy of it (a partial checkout, a Git LFS
pointer in place of the weights, a file edited by hand) would still load when its shapes happen to fit,
and the demo would then fine-tune and judge against weights nobody made. The file is `sha256sum`'s
format (`<hex>  <name>`), so `sha256sum -c SHA256SUMS` checks it by hand too. Folders without one
(init-model's, a user's download, train's exports) are read as before.
"""

from __future__ import annotations

from pathlib import Path

from voxpipe.errors import StepError
from voxpipe.integrity import file_entry

SUMS_FILE = "SHA256SUMS"


def read_sums(directory: Path) -> dict[str, str]:
    """name -> sha256 from directory/SHA256SUMS ({} when there is none)."""
    path = Path(directory) / SUMS_FILE
    if not path.is_file():
        return {}
    sums = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name:
            raise StepError(f"{path}: line {number} is not `<sha256>  <file name>` ({line[:80]!r})")
        sums[name.strip()] = digest.lower()
    return sums


def verify_checksums(directory: str | Path) -> None:
    """Raise a StepError naming the first listed file that is missing or whose sha256 differs."""
    directory = Path(directory)
    for name, expected in read_sums(directory).items():
        path = directory / name
        where = f"{directory / SUMS_FILE}"
        if not path.is_file():
            raise StepError(f"{path}: listed in {where} but missing; restore the folder "
                            f"(`git checkout -- {directory}`) or point model.base at another checkpoint")
        actual = file_entry(path)["sha256"]
        if actual != expected:
            raise StepError(
                f"{path}: sha256 {actual[:16]}… does not match {where} ({expected[:16]}…), so this is not "
                f"the file that was shipped (damaged, truncated, a Git LFS pointer or edited). Restore it "
                f"with "
                f"`git checkout -- {directory}`; if you remade the folder on purpose, its make script "
                f"rewrites {SUMS_FILE} with it (data/demo-base/make_demo_base.py for the demo base)"
            )
