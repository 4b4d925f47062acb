"""data/sample/make_sessions.py (long sessions from the sample's clips), for the tests that cut recordings."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "data" / "sample" / "make_sessions.py"
_spec = importlib.util.spec_from_file_location("make_sessions", _PATH)
make_sessions = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("make_sessions", make_sessions)
_spec.loader.exec_module(make_sessions)
