"""`evaluate.listening: required`: @champion waits for people's ears, not only for the figures.

register (registry.py) records the mode on each version it makes; with `required`, a version the rule
promotes is held back and tagged with the champion it was judged against, `voxpipe listen-record` moves
@champion once the recorded test passes (listen.py), and `voxpipe promote` refuses a version whose test
is missing or failed, saying which (promote.py). `off` and `advisory` (the default) leave the rule alone.
"""

from __future__ import annotations

from typing import Any

from voxpipe.evaluate.listen_answers import PASSED

MODE_TAG = "voxpipe.listening_mode"
VERDICT_TAG = "voxpipe.listening"  # "listening test passed (...)" or "... failed (...)" (listen_answers)
AWAITS_TAG = "voxpipe.listening_awaits"  # the @champion version the rule judged against ("none")
NO_CHAMPION = "none"
WAITS = ("@champion waits for a listening test (evaluate.listening required): have the listeners answer "
         "listen.html beside eval.json, then `voxpipe listen-record --answers FILE` for each file")


def listening_mode(evaluation: dict[str, Any]) -> str:
    """The mode the evaluation ran with (eval.json's settings; advisory when it predates the setting)."""
    return str((evaluation.get("settings") or {}).get("listening", "advisory"))


def missing_listening(version: str, tags: dict[str, str]) -> str | None:
    """What keeps a version from @champion under `required` (None: nothing, or not required)."""
    if tags.get(MODE_TAG) != "required":
        return None
    recorded = tags.get(VERDICT_TAG)
    if recorded is None:
        return (f"v{version} was evaluated with evaluate.listening required and has no listening test "
                f"recorded. {WAITS}")
    if not recorded.startswith(PASSED):
        return (f"v{version} was evaluated with evaluate.listening required and its recorded {recorded}. "
                "More listeners (`voxpipe listen-record`) or another candidate decide it")
    return None
