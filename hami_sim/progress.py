"""The one progress bar of hami-sim's long commands (`hami-sim chaos`, `hami-sim plan`), on stderr.

On a terminal it is one line redrawn in place (at most every `redraw_s`); anywhere else (a log file, CI) it
writes a plain line when another `step` of the work is done or `every_s` has passed since the last line,
so a log gets a bounded number of lines however often the caller updates. The line:

    label [##########..........] 520/1040 GPUs status | 0:12, 43.3 GPUs/s, ETA 0:12

`render_line` builds it from numbers and the elapsed time it is given (pure: no clock); `ProgressBar`
holds the clock (injectable) and decides when to write. In-house: no dependency for a few dozen
characters.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from typing import TextIO

MIN_WIDTH = 10
"""The narrowest bar drawn on a terminal too narrow for the whole line at the bar's width."""
RATE_AFTER_S = 1.0
"""Rate and ETA appear once this much time has passed: before, they are noise."""


def clock_text(seconds: float) -> str:
    """`m:ss`, or `h:mm:ss` from an hour on."""
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def rate_text(per_second: float) -> str:
    """Three significant figures at most: 1234/s, 43.3/s, 0.52/s."""
    if per_second >= 100:
        return f"{per_second:.0f}"
    if per_second >= 10:
        return f"{per_second:.1f}"
    return f"{per_second:.2f}"


def render_line(
    done: int,
    total: int,
    elapsed_s: float,
    *,
    label: str = "",
    status: str = "",
    unit: str = "",
    width: int = 30,
) -> str:
    """The progress line for `done` of `total` after `elapsed_s` seconds. Rate and ETA (from the average
    rate so far) once `RATE_AFTER_S` has passed and something is done; no ETA once all is done."""
    total = max(1, total)
    filled = max(0, min(width, width * done // total))
    parts = [label] if label else []
    parts.append(f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}" + (f" {unit}" if unit else ""))
    if status:
        parts.append(status)
    if elapsed_s >= RATE_AFTER_S:
        tail = [clock_text(elapsed_s)]
        if done > 0:
            rate = done / elapsed_s
            tail.append(rate_text(rate) + (f" {unit}/s" if unit else "/s"))
            if done < total:
                tail.append(f"ETA {clock_text((total - done) / rate)}")
        parts.append("| " + ", ".join(tail))
    return " ".join(parts)


class ProgressBar:
    """Writes `render_line` to `stream` (stderr by default) as the work goes; see the module's text for
    when. `close()` writes the last state if it was not written yet, ends a terminal's line, and returns
    the seconds since the bar was made (callers use it as the run's duration, written or not)."""

    def __init__(
        self,
        total: int,
        *,
        label: str = "",
        unit: str = "",
        stream: TextIO | None = None,
        enabled: bool = True,
        width: int = 30,
        redraw_s: float = 0.2,
        every_s: float = 10.0,
        step: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        tty: bool | None = None,
        columns: int | None = None,
    ) -> None:
        self.total = max(1, total)
        self.label, self.unit, self.width = label, unit, width
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.redraw_s, self.every_s, self.step = redraw_s, every_s, step
        self.clock = clock
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        if columns is None:
            columns = shutil.get_terminal_size().columns if self.tty and enabled else 0
        self.columns = columns
        """A terminal's width: its line is kept narrower (0: no limit)."""
        self.start = clock()
        self._last_write = -float("inf")
        self._steps_shown = 0
        """Off a terminal: the `step`s of the work the lines written so far have shown."""
        self._drawn = 0
        """Characters of the line last drawn on a terminal (0: none drawn, or ended)."""
        self._state: tuple[int, str] | None = None
        self._written = True

    def update(self, done: int, status: str = "", *, force: bool = False) -> None:
        """The work now: `done` of the total, `status` a short text after the count. Cheap when nothing is
        written (call it as often as you like)."""
        if not self.enabled:
            return
        self._state, self._written = (done, status), False
        now = self.clock()
        if not (force or self._due(done, now)):
            return
        self._write(now)

    def _due(self, done: int, now: float) -> bool:
        if self.tty:
            return now - self._last_write >= self.redraw_s
        return now - self._last_write >= self.every_s or self._steps(done) > self._steps_shown

    def _steps(self, done: int) -> int:
        return int(done / self.total / self.step + 1e-9) if self.step > 0 else 0

    def _write(self, now: float) -> None:
        if self._state is None:
            return
        done, status = self._state

        def line(width: int) -> str:
            return render_line(
                done,
                self.total,
                now - self.start,
                label=self.label,
                status=status,
                unit=self.unit,
                width=width,
            )

        text = line(self.width)
        if self.tty:
            room = self.columns - 1  # a full last column wraps on some terminals
            if self.columns > 1 and len(text) > room:  # a narrower bar first, then cut
                text = line(max(MIN_WIDTH, self.width - (len(text) - room)))[:room]
            self.stream.write("\r" + text.ljust(self._drawn))
            self._drawn = len(text)
        else:
            self.stream.write(text + "\n")
            self._steps_shown = max(self._steps_shown, self._steps(done))
        self.stream.flush()
        self._last_write, self._written = now, True

    def close(self) -> float:
        now = self.clock()
        if self.enabled:
            if not self._written:
                self._write(now)
            if self.tty and self._drawn:
                self.stream.write("\n")
                self.stream.flush()
                self._drawn = 0
        return now - self.start


__all__ = ["ProgressBar", "clock_text", "rate_text", "render_line"]
