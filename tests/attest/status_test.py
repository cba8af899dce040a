"""attest.edge.status: the verdict document the launcher and boot write for the probes, and the
probe that reads it. Hostile documents are refused naming the field; live means every named
process runs (a reused pid is not the old process); ready means accepted and, where a port
is named, /health answering 200 on loopback; the probe's whole run has one deadline."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from attest.edge.status import PROBE_DEADLINE_S, judge, main, start_time, write_status
from attest.errors import AttestError
from tests.fixtures.bounds import ended_by_deadline
from tests.fixtures.openai_server import ScriptedOpenAI
from tests.fixtures.processes import READY_WAIT_S


def me() -> list[int]:
    return [os.getpid(), start_time(os.getpid())]


def document(**fields) -> dict:
    base = {
        "schema_version": "1",
        "program": "boot",
        "stage": "accepted",
        "processes": [me()],
        "port": None,
        "reason": "",
        "written_ns": 1,
    }
    return {**base, **fields}


def written(tmp_path: Path, value) -> Path:
    path = tmp_path / "status.json"
    path.write_bytes(value if isinstance(value, bytes) else json.dumps(value).encode())
    return path


@pytest.mark.parametrize(
    "value,says",
    [
        (b"", "empty"),
        (b"{", "JSON"),
        (b"[]", "object"),
        (b" " * 5000, "4096"),
        (json.dumps(document(extra=1)).encode(), "expected the fields"),
        (json.dumps({k: v for k, v in document().items() if k != "port"}).encode(), "expected the fields"),
        (document(schema_version="2"), "schema_version"),
        (document(stage="ready"), "stage must be one of"),
        (document(processes=[]), "processes must list"),
        (document(processes=[me()] * 9), "processes must list"),
        (document(processes=[[os.getpid(), None]]), "processes holds"),  # a running pid, no start time
        (document(processes=[me(), [1, None]]), "processes holds"),
        (document(processes=[[0, None]]), "processes holds"),
        (document(processes=[[True, None]]), "processes holds"),
        (document(processes=[[1 << 23, None]]), "processes holds"),
        (document(processes=[[1, -1]]), "processes holds"),
        (document(processes=[1]), "processes holds"),
        (document(processes=[["1", None]]), "processes holds"),
        (document(port=0), "port must be"),
        (document(port=65536), "port must be"),
        (document(port="8888"), "port must be"),
        (document(reason=None), "must be strings"),
        (json.dumps(document()).replace('"stage"', '"stage": "starting", "stage"', 1).encode(), "duplicate"),
    ],
)
def test_a_hostile_document_is_no_verdict(tmp_path: Path, value, says: str) -> None:
    for want in ("live", "ready"):
        reason = judge(written(tmp_path, value), want)
        assert reason.startswith("no verdict:") and says in reason, reason


def test_a_missing_file_or_a_directory_is_no_verdict(tmp_path: Path) -> None:
    assert judge(tmp_path / "absent.json", "live").startswith("no verdict:")
    assert judge(tmp_path, "live").startswith("no verdict:")


def test_stages_decide_live_and_ready(tmp_path: Path) -> None:
    assert judge(written(tmp_path, document()), "ready") == ""
    assert judge(written(tmp_path, document(stage="starting")), "live") == ""
    assert "has not accepted yet (stage starting)" in judge(written(tmp_path, document(stage="starting")), "ready")
    for stage in ("lost", "refused"):
        path = written(tmp_path, document(stage=stage, reason="the group is gone"))
        for want in ("live", "ready"):
            assert judge(path, want) == f"boot is {stage}: the group is gone"


def _running(seconds: float) -> tuple[subprocess.Popen, list[int]]:
    """A child process and its [pid, start time], taken while it runs."""
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    deadline = time.monotonic() + READY_WAIT_S
    while start_time(child.pid) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return child, [child.pid, start_time(child.pid)]


def test_a_process_that_ended_or_was_replaced_is_not_live(tmp_path: Path) -> None:
    ended, recorded = _running(60)
    ended.kill()
    ended.wait()
    assert "no longer running" in judge(written(tmp_path, document(processes=[me(), recorded])), "live")
    reused = [os.getpid(), start_time(os.getpid()) + 1]  # same pid, another start: not the process that wrote it
    assert "no longer running" in judge(written(tmp_path, document(processes=[reused])), "live")
    zombie, recorded = _running(0.2)
    deadline = time.monotonic() + READY_WAIT_S
    while start_time(zombie.pid) is not None:  # exited, not yet reaped
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert os.path.exists(f"/proc/{zombie.pid}")
    assert "no longer running" in judge(written(tmp_path, document(processes=[recorded])), "live")
    zombie.wait()


def test_ready_asks_the_engines_health_on_loopback(tmp_path: Path) -> None:
    with ScriptedOpenAI(api_key="k") as server:
        path = written(tmp_path, document(port=server.port))
        assert judge(path, "ready") == ""
        assert server.unauthorized == 0  # /health needs no key, and the probe sends none
        server.healthy = False
        assert judge(path, "ready") == f"GET /health on port {server.port} answered 503"
        assert judge(path, "live") == ""  # liveness is the processes, not the engine's answer
    assert "failed: ConnectionRefusedError" in judge(path, "ready")


def _silent_server() -> tuple[socket.socket, int]:
    """Accepts, reads, never answers: a /health that hangs."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return listener, listener.getsockname()[1]


def test_the_probe_has_one_deadline_and_exit_codes(tmp_path: Path, monkeypatch, capsys) -> None:
    listener, port = _silent_server()
    try:
        monkeypatch.setenv("OMNI_STATUS_FILE", str(written(tmp_path, document(port=port))))
        started = time.monotonic()
        assert main(["ready"]) == 1
        took = time.monotonic() - started
    finally:
        listener.close()
    ended_by_deadline(took, PROBE_DEADLINE_S, math.inf)  # the server never answers: no other end
    assert capsys.readouterr().out.startswith("not ready: ")
    assert main(["live"]) == 0 and capsys.readouterr().out == "live\n"
    monkeypatch.delenv("OMNI_STATUS_FILE")
    assert main(["live"]) == 1 and "OMNI_STATUS_FILE is not set" in capsys.readouterr().out
    assert main(["sideways"]) == 2 and main([]) == 2


def test_write_status_is_atomic_redacted_and_fails_closed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("API_KEY", "sk-status-never-written-81")
    path = tmp_path / "run" / "status.json"
    write_status(path, program="boot", stage="refused", pids=[os.getpid()], reason="bad key sk-status-never-written-81")
    text = path.read_text()
    assert "sk-status-never-written-81" not in text
    assert json.loads(text)["processes"] == [me()]
    assert judge(path, "live").startswith("boot is refused: bad key ")
    assert [p.name for p in path.parent.iterdir()] == ["status.json"]  # no temporary left
    write_status(None, program="boot", stage="accepted", pids=[1])  # no file named: nothing written
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(AttestError) as refused:
        write_status(blocked / "status.json", program="boot", stage="starting", pids=[os.getpid()])
    assert refused.value.field == "OMNI_STATUS_FILE"


def _user_file(path: Path) -> None:
    path.write_text("my notes\n")


def _user_json(path: Path) -> None:
    path.write_text('{"stage": "accepted"}')  # JSON, but not a status document


def _directory(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_text("mine")


def _link_to_a_status_document(path: Path) -> None:
    target = path.with_name("elsewhere.json")
    write_status(target, program="launcher", stage="starting", pids=[os.getpid()])
    path.symlink_to(target)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize("plant", [_user_file, _user_json, _directory, _link_to_a_status_document, _fifo])
def test_only_a_status_document_is_ever_replaced(tmp_path: Path, plant) -> None:
    path = tmp_path / "status.json"
    plant(path)
    before = sorted((p.name, p.is_symlink(), p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
                    for p in tmp_path.rglob("*") if not p.is_fifo())  # fmt: skip
    with pytest.raises(AttestError, match="exists and is not a status document") as refused:
        write_status(path, program="boot", stage="starting", pids=[os.getpid()])
    assert refused.value.field == "OMNI_STATUS_FILE"
    after = sorted((p.name, p.is_symlink(), p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
                   for p in tmp_path.rglob("*") if not p.is_fifo())  # fmt: skip
    assert after == before


def test_an_earlier_runs_status_document_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_status(path, program="boot", stage="refused", pids=[os.getpid()], reason="earlier run")
    write_status(path, program="boot", stage="starting", pids=[os.getpid()])
    assert json.loads(path.read_text())["stage"] == "starting"


def test_the_probe_prints_a_refusal_reason_escaped(tmp_path: Path, capsys, monkeypatch) -> None:
    """The reason reaches `kubectl describe`: ANSI/OSC escapes, BEL, newlines and bidi overrides
    in a refusal cannot move a cursor, retitle a terminal or flip the text."""
    hostile = "bad \x1b[31mred\x1b[0m \x1b]0;title\x07 \u202eevil\u202c\nsecond line"
    path = written(tmp_path, document(stage="refused", reason=hostile))
    monkeypatch.setenv("OMNI_STATUS_FILE", str(path))
    assert main(["live"]) == 1
    shown = capsys.readouterr().out
    assert shown.count("\n") == 1 and not any(char in shown for char in "\x1b\x07\u202e\u202c")
    assert "\\u001b[31mred" in shown and "\\u202eevil" in shown and "\\u000asecond line" in shown


def test_only_the_main_process_tree_can_declare_the_verdict(tmp_path: Path) -> None:
    """With OMNI_STATUS_MAIN_PID (this test process as the program), a verdict whose first process
    is another one, or that names a process the program did not start, is not the program's."""
    child, recorded_child = _running(60)
    parent = [os.getppid(), start_time(os.getppid())]  # running, but not started by the program
    try:
        path = written(tmp_path, document(processes=[me(), recorded_child]))
        assert judge(path, "live", os.getpid()) == ""
        path = written(tmp_path, document(processes=[parent]))
        assert "not the program's" in judge(path, "live", os.getpid())
        path = written(tmp_path, document(processes=[me(), parent]))
        assert f"process {parent[0]} is not one the program" in judge(path, "ready", os.getpid())
    finally:
        child.kill()
        child.wait()


INTRUDER = """
import json, os, subprocess, sys
from pathlib import Path
from attest.edge.status import start_time, write_status
status = Path(sys.argv[1])
write_status(status, program="boot", stage="starting", pids=[os.getpid()])  # the program, PID 1
assert os.getpid() == 1
# Another process in the container (here a grandchild, as an exec'd shell would be a stranger)
# declares `accepted` with its own pid.
forge = ("import os, sys; from pathlib import Path; from attest.edge.status import write_status; "
         "write_status(Path(sys.argv[1]), program='boot', stage='accepted', pids=[os.getpid()])")
subprocess.run([sys.executable, "-c", forge, str(status)], check=True)
probe = subprocess.run([sys.executable, "-m", "attest.edge.status", "live"], capture_output=True, text=True,
                       env={**os.environ, "OMNI_STATUS_FILE": str(status), "OMNI_STATUS_MAIN_PID": "1"})
write_status(status, program="boot", stage="accepted", pids=[os.getpid()])  # the program's own verdict
own = subprocess.run([sys.executable, "-m", "attest.edge.status", "live"], capture_output=True, text=True,
                     env={**os.environ, "OMNI_STATUS_FILE": str(status), "OMNI_STATUS_MAIN_PID": "1"})
print(json.dumps({"code": probe.returncode, "out": probe.stdout, "own": [own.returncode, own.stdout]}))
"""


def test_another_process_writing_accepted_with_its_own_pid_does_not_make_the_pod_ready(tmp_path: Path) -> None:
    """In a pid namespace of the test's own, the program as PID 1, as in the container."""
    if os.geteuid() != 0:
        pytest.fail(f"a pid namespace needs root; this runs as uid {os.geteuid()}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", INTRUDER, str(tmp_path / "status.json")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 1 and "not the program's (pid 1, OMNI_STATUS_MAIN_PID)" in result["out"], result
    assert result["own"] == [0, "live\n"], result
