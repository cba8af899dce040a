"""pytest plugin for the mutation driver: the unmutated run records each test's duration,
and every mutant's run orders the tests fastest first, so `-x` stops at the cheapest test
that notices the mutant. Loaded with `-p tools.mutation.fastfirst`; the file is named by
OMNI_MUTATION_DURATIONS (recorded when OMNI_MUTATION_RECORD=1, read otherwise)."""
from __future__ import annotations

import json
import os
from pathlib import Path

_durations: dict[str, float] = {}


def _file() -> Path | None:
    name = os.environ.get("OMNI_MUTATION_DURATIONS")
    return Path(name) if name else None


def _recording() -> bool:
    return os.environ.get("OMNI_MUTATION_RECORD") == "1"


def pytest_collection_modifyitems(items) -> None:
    path = _file()
    if _recording() or path is None or not path.is_file():
        return
    known = json.loads(path.read_text(encoding="utf-8"))
    # Unknown tests (none, unless the tests changed since the baseline) go last, in file order.
    items.sort(key=lambda item: known.get(item.nodeid, float("inf")))


def pytest_runtest_logreport(report) -> None:
    if _recording():
        _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session) -> None:
    path = _file()
    if _recording() and path is not None:
        path.write_text(json.dumps(_durations, sort_keys=True), encoding="utf-8")
