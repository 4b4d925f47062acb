"""A checkpoint folder that ships a SHA256SUMS file is checked against it before its files are read.

The demo's base (data/demo-base) lives in git. A damaged copy of it (a partial checkout, a Git LFS
pointer in place of the weights, a file edited by hand) would still load when its shapes happen to fit,
and the demo would then fine-tune and judge against weights nobody made. The file is `sha256sum`'s
format (`<hex>  <name>`), so `sha256sum -c SHA256SUMS` checks it by hand too. Folders without one
(init-model's, a user's download, train's exports) are read as before.

A SHA256SUMS must list every file the loader reads that the folder holds (`LOADED_FILES`: config, weights,
AudioVAE, tokenizer files): one that leaves out the weights would otherwise let any weights load, so the
folder is refused.
"""

from __future__ import annotations

from pathlib import Path

from voxpipe.errors import StepError
from voxpipe.integrity import file_entry

SUMS_FILE = "SHA256SUMS"
# every file from_pretrained / the encoder / build_model may read (voxpipe/model/io.py MODEL_FILES,
# audiovae.py AUDIOVAE_FILES, encoder.py TOKENIZER_FILES; tests/test_integrity.py keeps them in step)
LOADED_FILES = (
    "config.json",
    "model.safetensors", "pytorch_model.bin",
    "audiovae.safetensors", "audiovae.pth",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
)


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
    sums = read_sums(directory)
    where = f"{directory / SUMS_FILE}"
    unlisted = [name for name in LOADED_FILES if (directory / name).exists() and name not in sums]
    if unlisted and (directory / SUMS_FILE).is_file():
        present = " ".join(n for n in LOADED_FILES if (directory / n).exists())
        raise StepError(
            f"{where}: does not list {', '.join(unlisted)}, which the loader reads, so nothing proves that "
            f"what it reads is what was shipped; the folder is refused. Restore the folder (`git checkout "
            f"-- {directory}`), or if you remade it on purpose, list every file it holds (`cd {directory} && "
            f"sha256sum {present} > {SUMS_FILE}`; data/demo-base/make_demo_base.py does that for the demo "
            "base)")
    for name, expected in sums.items():
        path = directory / name
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
