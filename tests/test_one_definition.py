"""Each rule has one home: the audio rate and the checkpoint check (voxpipe/voxcpm2_format.py) and the
batch rule (voxpipe/data/token_budget.py). The walk reads voxpipe/ and components/ as syntax trees, so
a comment or docstring that names a number is no second definition, and a second copy of the code is.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOMES = {
    "SAMPLE_RATE": "voxpipe/voxcpm2_format.py",
    "16 kHz literal": "voxpipe/voxcpm2_format.py",
    "config.json check": "voxpipe/voxcpm2_format.py",
    "not-a-checkpoint message": "voxpipe/voxcpm2_format.py",
    "TokenBudget": "voxpipe/data/token_budget.py",
    "max_tokens comparison": "voxpipe/data/token_budget.py",
}
# files that match a check for another thing of the same name
NOT_THE_RULE = {
    "voxpipe/evaluate/speaker.py": "config.json check",  # a WavLMForXVector folder, not a VoxCPM2 checkpoint
    "voxpipe/data/asr.py": "config.json check",  # a Whisper folder
}
CHECKS = ("is_file", "isfile", "exists", "is_dir")
# a file that holds none of these words defines none of the rules (and is not parsed)
WORDS = ("SAMPLE_RATE", "16000", "16_000", "config.json", "CONFIG", "VoxCPM2 checkpoint", "TokenBudget",
         "max_tokens")


def _names(node: ast.AST) -> set[str]:
    """The identifiers and string constants anywhere under `node`."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            found.add(sub.value)
    return found


def _config_checks(scope: ast.Module) -> bool:
    """Whether a module asks if a config.json exists, directly or through a variable that holds its
    path (`config_path = folder / "config.json"` ... `config_path.is_file()`)."""
    marks = {"config.json", "CONFIG"}
    assigned = [node for node in ast.walk(scope) if isinstance(node, ast.Assign)]
    marks |= {t.id for node in assigned if "config.json" in _names(node.value)
              for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(scope):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in CHECKS and marks & _names(node):
                return True
    return False


def _kinds(node: ast.AST) -> list[str]:
    """Which of the rules `node` defines or writes out (none for most nodes)."""
    kinds = []
    if isinstance(node, ast.Module) and _config_checks(node):
        kinds.append("config.json check")
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(t, ast.Name) and t.id == "SAMPLE_RATE" for t in targets):
            kinds.append("SAMPLE_RATE")
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value == 16000:
        kinds.append("16 kHz literal")
    if isinstance(node, ast.Constant) and "not a VoxCPM2 checkpoint" in str(node.value):
        kinds.append("not-a-checkpoint message")
    if isinstance(node, ast.ClassDef) and node.name == "TokenBudget":
        kinds.append("TokenBudget")
    if isinstance(node, ast.Compare) and "max_tokens" in _names(node):
        kinds.append("max_tokens comparison")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv) and "max_tokens" in _names(node):
        kinds.append("max_tokens comparison")
    return kinds


def definitions(root: Path, folders=("voxpipe", "components")) -> dict[str, set[str]]:
    """Rule -> the files (relative to `root`) that define or write it out."""
    found: dict[str, set[str]] = {kind: set() for kind in HOMES}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if not any(word in text for word in WORDS):  # most modules: no parse needed
                continue
            for node in ast.walk(ast.parse(text)):
                name = path.relative_to(root).as_posix()
                for kind in _kinds(node):
                    if NOT_THE_RULE.get(name) != kind:
                        found[kind].add(name)
    return found


def test_each_rule_has_one_home():
    assert definitions(ROOT) == {kind: {home} for kind, home in HOMES.items()}


def test_a_second_copy_is_found(tmp_path):
    """The walk can fail: a module that writes each rule again is listed beside the home."""
    for home in set(HOMES.values()):
        (tmp_path / home).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / home).write_text((ROOT / home).read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "components").mkdir()
    (tmp_path / "voxpipe" / "copy.py").write_text(
        "import os\nfrom pathlib import Path\nSAMPLE_RATE = 16_000\n"
        "class TokenBudget:\n    pass\n"
        "def fits(rows, longest, max_tokens):\n    return rows * longest <= max_tokens\n"
        "def check(folder):\n    if not os.path.isfile(os.path.join(folder, 'config.json')):\n"
        "        raise ValueError(f'{folder}: not a VoxCPM2 checkpoint')\n")
    found = definitions(tmp_path)
    assert found == {kind: {home, "voxpipe/copy.py"} for kind, home in HOMES.items()}
