"""Start-up progress of ``serve`` and ``generate``: what the process is doing while it fetches and
loads the model, readable on a terminal and in a log file alike.

``StartupLog`` is the ``progress`` callback that the loader and the catalog call:

* ``progress(msg)``: a step ("reading weights ...") -> one log line (``hypic.startup``);
* ``progress(msg, done=, total=)``: counted progress of the step ``msg`` (the model download, in
  bytes). On a terminal a one-line bar redrawn in place; otherwise (a log file, a pipe) a log line
  at most every ``every_s`` seconds or ``every_pct`` percent, and one when it completes;
* while a step runs, a heartbeat line every ``heartbeat_s`` seconds ("still reading weights ...
  (15 s)"), so a log never goes quiet for a minute.

``watch_bytes(folder, progress, msg, total)`` polls how many bytes are under a folder from a thread:
the download's progress without parsing pip's output. pip writes the wheel into its temp folder,
then *copies* it to the download folder, so for a download the count is the largest single file
(``largest_file_bytes``): the sum of all files would count the wheel twice while it is copied.

``hold_port(host, port)`` binds ``serve``'s port before the model load and keeps it: the bound
socket goes to uvicorn (``api/serve.py``), so no other process can take the port during the load
(``listen_now`` makes it listen when the server starts).
"""

from __future__ import annotations

import errno
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

LOGGER = "hypic.startup"


def human_bytes(n: float) -> str:
    """``98362432`` -> ``'93.8 MiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def path_bytes(path: Path | None) -> int:
    """Size of a file, or of every file under a folder (0 when absent)."""
    if path is None or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    total = 0
    for f in path.rglob("*"):
        try:
            total += f.stat().st_size if f.is_file() else 0
        except OSError:  # a temp file moved or removed while we walk
            continue
    return total


def largest_file_bytes(path: Path | None) -> int:
    """Size of the largest file under a folder (or of the file itself; 0 when absent): one download's
    bytes, however many copies of it a tool keeps while it works."""
    if path is None or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    largest = 0
    for f in path.rglob("*"):
        try:
            largest = max(largest, f.stat().st_size if f.is_file() else 0)
        except OSError:  # a temp file moved or removed while we walk
            continue
    return largest


class PortError(Exception):
    """``serve`` cannot listen on its host and port; the message says why and what to do."""


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def hold_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (port 0: a free port), not listening yet, that no other
    process can bind while it is held: the bind uvicorn would do (same family rule, with
    ``SO_REUSEADDR`` so connections of a previous run in TIME_WAIT do not block it), then
    ``SO_REUSEADDR`` off (on Linux a socket bound with it but not listening would let another such
    bind share the port, e.g. a second ``serve``). ``listen_now`` turns it back on and listens.
    Raises ``PortError`` that names the cause (busy, no permission, not an address of this host)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise PortError(
                f"port {port} on {host} is already in use (another `hypic-agent serve`?): stop that process, "
                "or pick a free port with --port N (or HYPIC_PORT)",
            ) from e
        where = _where(host, port)
        if e.errno == errno.EACCES:
            raise PortError(
                f"no permission to listen on {where} (ports below 1024 need privileges): use --port 8000 or higher"
            ) from e
        raise PortError(f"cannot listen on {where}: {e.strerror or e}; check --host (or HYPIC_HOST) and --port") from e
    return sock  # not inheritable (Python's default): worker processes never hold the port


def listen_now(sock: socket.socket, backlog: int) -> None:
    """Start listening on a socket from ``hold_port`` (``SO_REUSEADDR`` back on first, as uvicorn
    binds: a listening socket holds its port on its own)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.listen(backlog)


def port_problem(host: str, port: int) -> str | None:
    """Why ``serve`` could not listen on ``host:port`` now, or None (``hold_port``, released at once).
    Port 0 (any free port) is never a problem."""
    if port == 0:
        return None
    try:
        hold_port(host, port).close()
    except PortError as e:
        return str(e)
    return None


class StartupLog:
    """The ``progress`` callback of start-up (see the module doc); use it as a context manager."""

    def __init__(
        self,
        logger: logging.Logger | None = None,
        *,
        stream: TextIO | None = None,
        tty: bool | None = None,
        heartbeat_s: float = 5.0,
        every_s: float = 5.0,
        every_pct: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger or logging.getLogger(LOGGER)
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.heartbeat_s, self.every_s, self.every_pct = heartbeat_s, every_s, every_pct
        self.clock = clock
        self.t0 = clock()
        self._step = ""
        self._step_t0 = self.t0
        self._last_line = self.t0
        self._last_count: tuple[float, float] = (-1.0, -1.0)  # (time, percent) of the last counted line
        self._bar_open = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # ---------------------------------------------------------------------------- callback
    def __call__(self, msg: str, *, done: int | None = None, total: int | None = None, unit: str = "B") -> None:
        with self._lock:
            if done is None:
                self._end_bar()
                self._step, self._step_t0 = msg, self.clock()
                self._line(msg)
            else:
                self._count(msg, done, total or 0, unit)

    def _line(self, msg: str, level: int = logging.INFO, **fields: Any) -> None:
        now = self.clock()
        self._last_line = now
        self.logger.log(level, msg, extra={"fields": {"elapsed_s": round(now - self.t0, 1), **fields}})

    def _count(self, msg: str, done: int, total: int, unit: str) -> None:
        now = self.clock()
        if msg != self._step:
            self._end_bar()
            self._step, self._step_t0, self._last_count = msg, now, (-1.0, -1.0)
        pct = 100.0 * done / total if total > 0 else 0.0
        complete = total > 0 and done >= total
        last_t, last_pct = self._last_count
        if complete and last_pct >= 100.0:
            return  # the completion was shown already
        text = f"{msg}: {self._amount(done, total, unit)}"
        if self.tty:
            self.stream.write(f"\r{text}\x1b[K")
            self.stream.flush()
            self._bar_open, self._last_line, self._last_count = True, now, (now, pct)
            if complete:
                self._end_bar()
        elif last_t < 0 or complete or now - last_t >= self.every_s or pct - last_pct >= self.every_pct:
            self._last_count = (now, pct)
            self._line(text, done=done, total=total or None, unit=unit)

    def _amount(self, done: int, total: int, unit: str) -> str:
        fmt = human_bytes if unit == "B" else (lambda n: f"{n:.0f} {unit}")
        if total <= 0:
            return fmt(done)
        if done > total:  # the expected total was wrong: never a share above 100%
            return f"{fmt(done)} (expected {fmt(total)})"
        rate = ""
        dt = self.clock() - self._step_t0
        if unit == "B" and dt > 0.5:
            rate = f", {human_bytes(done / dt)}/s"
        return f"{fmt(done)} of {fmt(total)} ({100.0 * done / total:.0f}%{rate})"

    def _end_bar(self) -> None:
        if self._bar_open:
            self.stream.write("\n")
            self.stream.flush()
            self._bar_open = False

    # ---------------------------------------------------------------------------- heartbeat
    def _heartbeat(self) -> None:
        while not self._stop.wait(min(1.0, self.heartbeat_s / 2)):
            with self._lock:
                now = self.clock()
                if self._step and now - self._last_line >= self.heartbeat_s:
                    self._end_bar()
                    self._line(f"still {self._step} ({now - self._step_t0:.0f} s)")

    def __enter__(self) -> StartupLog:
        if self.heartbeat_s > 0:
            self._beat = threading.Thread(target=self._heartbeat, name="startup-heartbeat", daemon=True)
            self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        with self._lock:
            self._end_bar()
            self._step = ""

    def done(self, msg: str, **fields: Any) -> None:
        """The last line of start-up, with the total time; ends the heartbeat's step."""
        with self._lock:
            self._end_bar()
            self._step = ""
            self._line(f"{msg} (start-up took {self.clock() - self.t0:.1f} s)", **fields)


@contextmanager
def watch_bytes(
    folder: Path,
    progress: Any,
    msg: str,
    total: int,
    interval_s: float = 0.5,
    measure: Callable[[Path], int] = path_bytes,
) -> Iterator[None]:
    """While the block runs, ``progress(msg, done=measure(folder), total=total)`` from a thread every
    ``interval_s`` when the count changed (``measure``: every file's bytes, or ``largest_file_bytes``
    for one download); nothing when ``progress`` is None."""
    if progress is None:
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        last = -1
        while not stop.wait(interval_s):
            n = measure(folder)
            if n != last:
                progress(msg, done=n, total=total)
                last = n

    thread = threading.Thread(target=loop, name="watch-bytes", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    progress(msg, done=measure(folder), total=total)  # the block succeeded: the final count
