"""hami_sim.progress: the line (pure, time passed in) and when the bar writes it (a fake clock)."""

from __future__ import annotations

import io

import pytest

from hami_sim.progress import ProgressBar, clock_text, rate_text, render_line


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0:00"), (-3, "0:00"), (59.9, "0:59"), (61, "1:01"), (3725, "1:02:05")]
)
def test_clock_text_is_minutes_and_seconds_with_hours_from_an_hour_on(seconds: float, text: str) -> None:
    assert clock_text(seconds) == text


@pytest.mark.parametrize(("rate", "text"), [(1234.4, "1234"), (43.34, "43.3"), (0.519, "0.52")])
def test_rate_text_keeps_three_significant_figures_at_most(rate: float, text: str) -> None:
    assert rate_text(rate) == text


def test_line_in_the_first_second_has_no_rate_nor_eta() -> None:
    assert render_line(5, 10, 0.5, width=10, status="live 3") == "[#####.....] 5/10 live 3"


def test_line_has_label_unit_elapsed_rate_and_eta_from_the_average_rate() -> None:
    line = render_line(520, 1040, 12.0, label="inflation fgd", unit="GPUs", width=20)
    assert line == "inflation fgd [##########..........] 520/1040 GPUs | 0:12, 43.3 GPUs/s, ETA 0:12"


def test_line_when_done_has_no_eta_and_nothing_done_has_no_rate() -> None:
    assert render_line(10, 10, 5.0, width=4) == "[####] 10/10 | 0:05, 2.00/s"
    assert render_line(0, 10, 5.0, width=4) == "[....] 0/10 | 0:05"


def test_line_bar_stays_within_its_width_past_the_total_and_for_a_zero_total() -> None:
    assert render_line(15, 10, 0.0, width=4) == "[####] 15/10"
    assert render_line(0, 0, 0.0, width=4) == "[....] 0/1"


def test_off_a_terminal_lines_are_bounded_by_steps_and_time_however_many_updates() -> None:
    clock, out = FakeClock(), io.StringIO()
    bar = ProgressBar(10_000, stream=out, clock=clock, every_s=10.0, step=0.1)
    for done in range(1, 10_001):
        clock.now = 100.0 + done * 0.003  # 30 s in all: 3 lines by time at most
        bar.update(done, "status")
    elapsed = bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert 10 <= len(lines) <= 1 + 10 + 3
    assert lines[-1] == "[" + "#" * 30 + "] 10000/10000 status | 0:30, 333/s"
    assert elapsed == pytest.approx(30.0)


def test_off_a_terminal_a_line_every_every_s_while_the_count_stands_still() -> None:
    clock, out = FakeClock(), io.StringIO()
    bar = ProgressBar(100, stream=out, clock=clock, every_s=10.0)
    for _ in range(100):  # 50 s at done=5: the first line, then one each 10 s
        bar.update(5)
        clock.now += 0.5
    assert len(out.getvalue().splitlines()) == 5


def test_close_writes_the_last_state_once_if_it_was_not_written() -> None:
    clock, out = FakeClock(), io.StringIO()
    bar = ProgressBar(100, stream=out, clock=clock, width=4)
    bar.update(1)
    bar.update(2)
    bar.close()
    assert out.getvalue() == "[....] 1/100\n[....] 2/100\n"


def test_on_a_terminal_the_line_is_redrawn_in_place_at_most_every_redraw_s_and_ended_on_close() -> None:
    clock, out = FakeClock(), Tty()
    bar = ProgressBar(4, stream=out, clock=clock, width=4, redraw_s=0.2, label="replay")
    bar.update(1, "a long status")
    clock.now += 0.1
    bar.update(2)  # too soon: not drawn now, drawn by close
    bar.close()
    assert out.getvalue() == "\rreplay [#...] 1/4 a long status" + "\rreplay [##..] 2/4" + " " * 14 + "\n"


def test_on_a_narrow_terminal_the_bar_narrows_before_the_line_is_cut() -> None:
    clock, out = FakeClock(), Tty()
    bar = ProgressBar(100, stream=out, clock=clock, columns=41, label="replay")
    clock.now += 10.0
    bar.update(50)
    bar.close()
    drawn = out.getvalue().strip("\r\n")
    assert drawn == "replay [#####.....] 50/100 | 0:10, 5.00/s"[:40]
    bar = ProgressBar(100, stream=(out := Tty()), clock=clock, columns=41, label="replay", width=30)
    clock.now += 10.0
    bar.update(50, "a status too long for the room left on this terminal")
    assert out.getvalue() == "\r" + "replay [#####.....] 50/100 a status too long"[:40]


def test_a_disabled_bar_writes_nothing_and_still_times_the_run() -> None:
    clock, out = FakeClock(), Tty()
    bar = ProgressBar(4, stream=out, clock=clock, enabled=False)
    bar.update(2, force=True)
    clock.now += 7.0
    assert bar.close() == pytest.approx(7.0)
    assert out.getvalue() == ""
