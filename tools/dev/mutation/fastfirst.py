"""pytest plugin for the mutation driver: the tests most likely to notice a mutant run first,
so `-x` stops early. Order: tests that killed earlier mutants of the same module (most kills
first: mutants of one module tend to fall to the same few tests), then the rest fastest first
(durations recorded by the unmutated run). The files are named by the driver:
OMNI_MUTATION_DURATIONS (recorded when OMNI_MUTATION_RECORD=1, read otherwise),
OMNI_MUTATION_KILLERS (read: test id -> kills so far) and OMNI_MUTATION_FAILED (written: the
test that failed, if any)."""

from __future__ import annotations

import json
import os
from pathlib import Path

_durations: dict[str, float] = {}


def _file(variable: str) -> Path | None:
    name = os.environ.get(variable)
    return Path(name) if name else None


def _recording() -> bool:
    return os.environ.get("OMNI_MUTATION_RECORD") == "1"


def _read(variable: str) -> dict[str, float]:
    path = _file(variable)
    return json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else {}


def pytest_collection_modifyitems(items) -> None:
    if _recording():
        return
    durations, kills = _read("OMNI_MUTATION_DURATIONS"), _read("OMNI_MUTATION_KILLERS")
    # Unknown tests (none, unless the tests changed since the baseline) go last, in file order.
    items.sort(key=lambda item: (-kills.get(item.nodeid, 0), durations.get(item.nodeid, float("inf"))))


def pytest_runtest_logreport(report) -> None:
    if _recording():
        _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    elif report.failed and (path := _file("OMNI_MUTATION_FAILED")) is not None and not path.exists():
        path.write_text(report.nodeid, encoding="utf-8")


def pytest_sessionfinish(session) -> None:
    path = _file("OMNI_MUTATION_DURATIONS")
    if _recording() and path is not None:
        path.write_text(json.dumps(_durations, sort_keys=True), encoding="utf-8")
