"""The program's own verdict for Kubernetes' probes: a small status document the launcher and
boot write where OMNI_STATUS_FILE names (never a secret, no key needed to read it), and the
probe that reads it: `omni-run attest.edge.status ready|live`.

Stages: `starting` (checks and loading under way), `accepted` (the program's verdict: the
launcher's checks passed and vLLM is exec'd; boot's smoke, warm-up and batch checks passed on
rank 0, rank 0's authenticated verdict taken and SGLang started on a worker), `lost` (rank 0
saw the group stop answering after acceptance) and `refused`.

- `live`: the stage is neither `lost` nor `refused`, and every process the document names runs
  (each pid with its start time, so a pid reused after a restart is not taken for the old one);
- `ready`: live, the stage is `accepted`, and where the document names the API port, the
  engine's own /health answers 200 on loopback.

The document is untrusted like every file: read once, bounded, every field checked; the
probe only ever connects to 127.0.0.1, and its whole run has one deadline.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from attest.edge.redact import escaped, redact_known
from attest.edge.settings import Setting, optional_path
from attest.errors import AttestError
from attest.files import write_atomic
from attest.reader import loads_object, read_file

STATUS_FILE_VARIABLE = "OMNI_STATUS_FILE"
# The probe's own variable (deploy sets it to 1: the program is the container's PID 1, run in
# process by the entry shim): a verdict counts only when its first process is that one, with
# its recorded start time, and every other process it names descends from it. So a process the
# program did not start (an exec'd shell, a stray child's child) writing `accepted` with its own
# pid does not make the pod ready.
MAIN_PID_VARIABLE = "OMNI_STATUS_MAIN_PID"
MAX_ANCESTRY = 64  # parent links followed from a named process towards the main one
STATUS_SETTING = Setting(
    STATUS_FILE_VARIABLE,
    "status_file",
    "",
    optional_path,
    "where the program reports its verdict for the readiness and liveness probes (the manifests set it)",
)
STAGES = ("starting", "accepted", "lost", "refused")
SCHEMA_VERSION = "1"
MAX_STATUS_BYTES = 4096
MAX_PIDS = 8
PID_MAX = 1 << 22  # the kernel's largest pid_max
HEALTH_PATH = "/health"  # vLLM and SGLang both serve it without the API key
# The probe's whole run (read, process checks, /health): under the manifests' probe
# timeoutSeconds, so a trickling /health fails the probe here rather than being killed.
PROBE_DEADLINE_S = 4.0
# The longest reason kept: enough for a refusal's first line, never a log.
MAX_REASON = 300


def _stat(pid: int) -> list[bytes] | None:
    """/proc/PID/stat from field 3 on (state, ppid, ...), or None when no such process runs or it
    is a zombie."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after the last.
    fields = data[data.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return fields


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None
    when no such process runs or it is a zombie."""
    fields = _stat(pid)
    return int(fields[19]) if fields is not None else None


def _descends(pid: int, ancestor: int) -> bool:
    """Whether `pid` is `ancestor` or one of its descendants (parent links, bounded)."""
    for _ in range(MAX_ANCESTRY):
        if pid == ancestor:
            return True
        fields = _stat(pid)
        if fields is None or int(fields[1]) in (0, pid):
            return False
        pid = int(fields[1])
    return False


def write_status(
    path: Path | None, *, program: str, stage: str, pids: Sequence[int], port: int | None = None, reason: str = ""
) -> None:
    """Report `stage` (atomically: a probe reads the old document or the new one). No path:
    nothing to report (run outside the manifests). A write that fails is a refusal naming
    OMNI_STATUS_FILE: a verdict nobody can read would leave the pod unready for ever."""
    if path is None:
        return
    if stage not in STAGES:
        raise ValueError(stage)
    _require_replaceable(path)
    document = {
        "schema_version": SCHEMA_VERSION,
        "program": program,
        "stage": stage,
        "processes": [[pid, start_time(pid)] for pid in pids],
        "port": port,
        "reason": redact_known(reason)[:MAX_REASON],
        "written_ns": time.time_ns(),
    }
    write_atomic(path, json.dumps(document).encode(), field=STATUS_FILE_VARIABLE)


def _require_replaceable(path: Path) -> None:
    """Only a status document is ever replaced: a file of the user's, a directory, a link or a
    special file at OMNI_STATUS_FILE is refused (at start-up: the first write) and left as it is."""
    if not os.path.lexists(path):
        return
    try:
        data = read_file(path, label=str(path), max_bytes=MAX_STATUS_BYTES, follow_symlinks=False).data
        _checked(loads_object(data, label=str(path)), str(path))
    except AttestError:
        raise AttestError(
            f"{STATUS_FILE_VARIABLE} {path} exists and is not a status document (a file of someone else's, a "
            "directory, a link or a special file); it was left as it is: name a path of its own",
            field=STATUS_FILE_VARIABLE,
        ) from None


def report_refused(path: Path | None, *, program: str, error: AttestError) -> None:
    """A refusal as the verdict, best effort: the refusal itself is reported on stderr either way,
    and one about the status file itself cannot be written there."""
    if error.field == STATUS_FILE_VARIABLE:
        return
    try:
        write_status(path, program=program, stage="refused", pids=[os.getpid()], reason=str(error))
    except AttestError:
        pass


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def read_status(path: Path) -> dict[str, Any]:
    """The document, every field checked; AttestError naming the field otherwise."""
    label = str(path)
    return _checked(loads_object(read_file(path, label=label, max_bytes=MAX_STATUS_BYTES).data, label=label), label)


def _checked(document: dict[str, Any], label: str) -> dict[str, Any]:
    expected = {"schema_version", "program", "stage", "processes", "port", "reason", "written_ns"}
    if set(document) != expected:
        raise AttestError(f"{label}: expected the fields {sorted(expected)}, got {sorted(document)}", field=label)
    if document["schema_version"] != SCHEMA_VERSION:
        raise AttestError(f"{label}: schema_version must be {SCHEMA_VERSION!r}", field="schema_version")
    if document["stage"] not in STAGES:
        raise AttestError(f"{label}: stage must be one of {', '.join(STAGES)}", field="stage")
    processes = document["processes"]
    if not isinstance(processes, list) or not 1 <= len(processes) <= MAX_PIDS:
        raise AttestError(f"{label}: processes must list 1..{MAX_PIDS} [pid, start time] pairs", field="processes")
    for item in processes:
        if not (
            isinstance(item, list) and len(item) == 2 and _whole(item[0], 1, PID_MAX) and _whole(item[1], 0, 1 << 63)
        ):
            # A start time is required: without one, a pid reused by any other process would pass.
            raise AttestError(f"{label}: processes holds {item!r}; expected [pid, start time]", field="processes")
    if document["port"] is not None and not _whole(document["port"], 1, 65535):
        raise AttestError(f"{label}: port must be 1..65535 or null", field="port")
    if not isinstance(document["reason"], str) or not isinstance(document["program"], str):
        raise AttestError(f"{label}: program and reason must be strings", field="reason")
    return document


def _health(port: int) -> str:
    """'' when the engine's /health on loopback answers 200, else why not."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_DEADLINE_S)
    try:
        connection.request("GET", HEALTH_PATH)
        status = connection.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        return f"GET {HEALTH_PATH} on port {port} failed: {type(exc).__name__}"
    finally:
        connection.close()
    return "" if status == 200 else f"GET {HEALTH_PATH} on port {port} answered {status}"


def _not_the_programs(document: dict[str, Any], main_pid: int | None) -> str:
    """Why the named processes are not the program's own tree ('' when they are or no main pid
    is set)."""
    if main_pid is None:
        return ""
    first = document["processes"][0][0]
    if first != main_pid:
        return f"the verdict names process {first} first, not the program's (pid {main_pid}, {MAIN_PID_VARIABLE})"
    for pid, _ in document["processes"][1:]:
        # One that ended is judged below (no longer running); one that runs must be the program's.
        if start_time(pid) is not None and not _descends(pid, main_pid):
            return f"process {pid} is not one the program (pid {main_pid}) started"
    return ""


def judge(path: Path, want: str, main_pid: int | None = None) -> str:
    """'' when the pod is `want` (live or ready), else the reason it is not. With `main_pid`, the
    verdict must be that process's (see MAIN_PID_VARIABLE)."""
    try:
        document = read_status(path)
    except AttestError as exc:
        return f"no verdict: {exc}"
    stage = document["stage"]
    foreign = _not_the_programs(document, main_pid)
    if foreign:
        return f"no verdict of the program's: {foreign}"
    if stage in ("lost", "refused"):
        return f"{document['program']} is {stage}: {document['reason']}"
    for pid, started in document["processes"]:
        now = start_time(pid)
        if now is None or now != started:
            return f"process {pid} of {document['program']} is no longer running"
    if want == "live":
        return ""
    if stage != "accepted":
        return f"{document['program']} has not accepted yet (stage {stage})"
    return _health(document["port"]) if document["port"] is not None else ""


def _expire(*_: object) -> None:
    raise TimeoutError


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] not in ("ready", "live"):
        print("usage: omni-run attest.edge.status ready|live  (reads the file OMNI_STATUS_FILE names)", file=sys.stderr)
        return 2
    raw = os.environ.get(STATUS_FILE_VARIABLE, "")
    if not raw:
        print(f"not {args[0]}: {STATUS_FILE_VARIABLE} is not set", flush=True)
        return 1
    main_raw = os.environ.get(MAIN_PID_VARIABLE, "")
    if main_raw and not (main_raw.isascii() and main_raw.isdigit() and 1 <= int(main_raw) <= PID_MAX):
        print(f"not {args[0]}: {MAIN_PID_VARIABLE} must be a pid, got {escaped(main_raw)[:40]!r}", flush=True)
        return 1
    signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, PROBE_DEADLINE_S)
    try:
        reason = judge(Path(raw), args[0], int(main_raw) if main_raw else None)
    except TimeoutError:
        reason = f"the probe took longer than {PROBE_DEADLINE_S:g} s"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    # The reason reaches `kubectl describe` and terminals: nothing in it can move a cursor or flip text.
    print(f"not {args[0]}: {escaped(reason)}" if reason else args[0], flush=True)
    return 1 if reason else 0


if __name__ == "__main__":
    raise SystemExit(main())
