"""The process runtime with real child processes on loopback: start in a group, stop by SIGTERM then
SIGKILL, wait until ready or fail naming the process with its log tail. Every wait is bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtpstack.runtime import Process, Processes, StartError, free_port, log_tail, tail_text, url_of, wait_all_ready

ROOT = Path(__file__).resolve().parents[2]
#: Bounds for a busy 2-core machine: starting Python takes well under a second.
START_S = 15.0


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def wait_for_line(path: Path, text: str, timeout: float = START_S) -> None:
    deadline = time.monotonic() + timeout
    while text not in (path.read_text() if path.exists() else ""):
        assert time.monotonic() < deadline, f"no `{text}` in {path} after {timeout:g} s"
        time.sleep(0.02)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie is gone too
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


@pytest.mark.parametrize(("host", "url"), [
    ("127.0.0.1", "http://127.0.0.1:80"),
    ("0.0.0.0", "http://127.0.0.1:80"),
    ("", "http://127.0.0.1:80"),
    ("::", "http://[::1]:80"),
    ("::1", "http://[::1]:80"),
    ("fe80::2", "http://[fe80::2]:80"),
    ("mac1.local", "http://mac1.local:80"),
])
def test_url_of_reaches_a_wildcard_bind_on_loopback_and_brackets_ipv6(host, url):
    assert url_of(host, 80) == url


def test_a_free_port_can_be_bound():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))


def armed(log: Path, setup: str, body: str = "time.sleep(60)") -> Process:
    """A Python child that runs `setup`, says `armed`, then runs `body`; started, and armed."""
    p = Process(python(f"import signal, time\n{setup}\nprint('armed', flush=True)\n{body}"), log_path=log).start()
    wait_for_line(log, "armed")
    return p


def test_a_process_that_ignores_sigterm_is_sigkilled_after_the_timeout(tmp_path):
    p = armed(tmp_path / "stubborn.log", "signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    t0 = time.monotonic()
    assert p.stop(timeout=0.5) == -signal.SIGKILL
    # at least the grace it was given, and far less than its 60 s sleep
    assert 0.5 <= time.monotonic() - t0 < 10
    assert not p.alive() and p.exit_code == -signal.SIGKILL


def test_interrupt_lets_a_process_shut_down_on_sigint_and_stops_one_that_ignores_it(tmp_path):
    # The handler set explicitly, as `mtpstack up` does: a child of a background job starts with SIGINT ignored.
    graceful = armed(tmp_path / "graceful.log", "signal.signal(signal.SIGINT, signal.default_int_handler)",
                     "try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    raise SystemExit(7)")
    assert graceful.interrupt(timeout=10) == 7
    deaf = armed(tmp_path / "deaf.log", "signal.signal(signal.SIGINT, signal.SIG_IGN)")
    assert deaf.interrupt(timeout=0.5) == -signal.SIGTERM


def test_stop_reaches_the_children_of_the_process(tmp_path):
    log = tmp_path / "parent.log"
    code = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('child', c.pid, flush=True); time.sleep(60)")
    p = Process(python(code), log_path=log).start()
    wait_for_line(log, "child ")
    child = int(log.read_text().split("child ", 1)[1].split()[0])
    assert p.stop(timeout=5) == -signal.SIGTERM
    deadline = time.monotonic() + START_S
    while not gone(child):
        assert time.monotonic() < deadline, "the child outlived its group's SIGTERM"
        time.sleep(0.05)


def test_a_process_that_exits_early_is_named_with_its_exit_code_and_log_tail(tmp_path):
    log = tmp_path / "w0.log"
    p = Process(python("import sys; print('loading no-such-model'); sys.exit(3)"), log_path=log, name="w0", kind="worker",
                url=url_of("127.0.0.1", free_port())).start()
    t0 = time.monotonic()
    with pytest.raises(StartError) as e:
        p.wait_ready("/health", timeout=START_S, state="healthy")
    assert time.monotonic() - t0 < START_S
    assert e.value.exited and e.value.exit_code == 3 and e.value.process is p
    assert str(e.value) == f"worker `w0` exited with code 3 before it was healthy\n\nlog tail ({log}):\nloading no-such-model"


def test_a_process_that_never_answers_times_out_naming_the_url_it_polled(tmp_path):
    log = tmp_path / "proxy.log"
    url = url_of("127.0.0.1", free_port())
    p = Process(python("import time; print('listening nowhere', flush=True); time.sleep(60)"), log_path=log, name="proxy", kind="proxy",
                url=url).start()
    try:
        with pytest.raises(StartError) as e:
            p.wait_ready("/readyz", timeout=0.5)
        assert not e.value.exited
        assert str(e.value).startswith(f"proxy `proxy` not ready after 0.5 s at {url}/readyz\n\nlog tail ({log}):\n")
        assert p.alive()  # a timeout does not stop it: the caller decides
    finally:
        p.stop(timeout=5)


def test_wait_all_ready_reports_each_process_as_it_answers(tmp_path):
    procs = Processes()
    try:
        ps = []
        for name in ("a", "b"):
            port = free_port()
            ps.append(procs.start([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
                                  log_path=tmp_path / f"{name}.log", name=name, url=url_of("127.0.0.1", port)))
        seen = []
        wait_all_ready([(p, "/") for p in ps], START_S, on_ready=lambda p: seen.append(p.name))
        assert sorted(seen) == ["a", "b"]
    finally:
        procs.stop_all(timeout=5)
    assert not any(p.alive() for p in ps)


def test_on_tick_may_give_up_the_wait(tmp_path):
    p = Process(python("import time; time.sleep(60)"), log_path=tmp_path / "x.log", url=url_of("127.0.0.1", free_port())).start()
    try:
        def give_up(elapsed):
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            p.wait_ready("/", timeout=START_S, on_tick=give_up)
    finally:
        p.stop(timeout=5)


def test_output_is_appended_to_the_log_and_stdout_can_be_kept_apart(tmp_path):
    log, out = tmp_path / "both.log", tmp_path / "out.txt"
    log.write_text("earlier run\n")
    code = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"
    Process(python(code), log_path=log).start().wait(START_S)
    assert log.read_text().splitlines() == ["earlier run", "to stdout", "to stderr"]
    split = tmp_path / "split.log"
    Process(python(code), log_path=split, stdout_path=out).start().wait(START_S)
    assert (split.read_text(), out.read_text()) == ("to stderr\n", "to stdout\n")


def test_the_log_tail_is_raw_lines_and_a_renderer_plugs_in(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)) + '{"event": "listening"}\n\n')
    assert log_tail(log, 3) == ["line 29", '{"event": "listening"}', ""]
    assert tail_text(log, 3) == 'line 29\n{"event": "listening"}'
    assert tail_text(log, 2, render=str.upper) == '{"EVENT": "LISTENING"}'
    assert log_tail(tmp_path / "missing.log") is None and tail_text(tmp_path / "missing.log") == "(no log)"


def test_the_log_tail_of_a_long_log_is_its_last_lines_exactly(tmp_path):
    # Read back from the end in growing blocks: lines across block edges, multi-byte text, no final newline.
    log = tmp_path / "long.log"
    lines = [f"línea {i} " + "x" * (i % 300) for i in range(20_000)]
    log.write_text("\n".join(lines))
    assert log_tail(log, 20) == lines[-20:]
    assert log_tail(log, 1) == lines[-1:] and log_tail(log, 0) == []
    log.write_text("\n".join(lines) + "\n")
    assert log_tail(log, 500) == lines[-500:]
    short = tmp_path / "short.log"
    short.write_text("only\n")
    assert log_tail(short, 20) == ["only"]
    short.write_text("")
    assert log_tail(short, 20) == []


def test_no_other_module_starts_or_signals_process_groups():
    """The runtime is the one owner of process groups: nothing else in the product, the benches,
    the dev kit or the tests starts a new session or signals a group by hand."""
    offenders = []
    for folder in ("mtpstack", "proxy", "worker", "validator", "bench", "devkit", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == ROOT / "mtpstack" / "runtime.py" or path == Path(__file__):
                continue
            text = path.read_text()
            for needle in ("start_new_session", "os.killpg", "def free_port"):
                if needle in text:
                    offenders.append(f"{path.relative_to(ROOT)}: {needle}")
    assert offenders == []


def test_a_process_never_started_has_no_exit_code_and_stop_is_a_no_op(tmp_path):
    p = Process(python("pass"), log_path=tmp_path / "x.log")
    assert p.exit_code is None and not p.alive() and p.stop() is None
    with pytest.raises(RuntimeError, match="not started"):
        p.wait(1)
    sleeper = Process(python("import time; time.sleep(60)"), log_path=tmp_path / "y.log").start()
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            sleeper.wait(0.01)
    finally:
        sleeper.stop(timeout=5)


def test_a_run_of_free_ports_starts_where_every_one_of_them_can_be_bound():
    import socket

    from mtpstack.runtime import free_port_run

    base = free_port_run(3)
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(3)]
    try:
        for i, s in enumerate(sockets):
            s.bind(("127.0.0.1", base + i))  # raises if one of the three was taken
    finally:
        for s in sockets:
            s.close()
