"""Async metrics rows measure their rates over at least ``host_loop.RATE_WINDOW_S`` (a row made
moments after the previous one must not report the rate of a single hand-off)."""

from __future__ import annotations

import pytest

from tianji_jax.run import host_loop


class _FakeRunner:
    """What :func:`host_loop.run_async` uses of a runner: counter snapshots at given times."""

    start_version = 0

    def __init__(self, times: list[float]):
        self.times = times
        self.snapshot: dict = {}

    def _snap(self, i: int) -> dict:
        return {"time": self.times[i], "consumed": 100 * i, "learner_states": object()}

    def take_snapshot(self) -> dict:
        return self._snap(0)

    def run(self, on_update) -> int:
        for i in range(1, len(self.times)):
            self.snapshot = self._snap(i)
            if on_update(i, {}, None):
                break
        return len(self.times) - 1


class _Files:
    def maybe_save(self, *args, **kwargs) -> None:
        pass


def _windows(times: list[float], every: int = 1) -> list[tuple[float, float, float]]:
    """(window start time, window seconds, rate of 'consumed') of every row."""
    seen: list = []

    def make_row(pending, snap, last, window, n):
        assert "learner_states" not in window.start  # counters only: no device state is kept
        seen.append((window.start["time"], window.seconds, window.rate(snap, "consumed")))
        return host_loop.AsyncRow({}, None, None, None, None, 0, {})

    host_loop.run_async(_FakeRunner(times), _Files(), lambda *a: False, None, every=every, total=len(times) - 1,
                        make_row=make_row, close=lambda: None)
    return seen


def test_fast_rows_use_the_trailing_window_and_slow_rows_their_own_interval():
    assert host_loop.RATE_WINDOW_S == 1.0
    rows = _windows([0.0, 0.5, 1.6, 1.635, 3.0, 3.01])
    # row 1: 0.5 s after the start -> from the start; row 2: its own 1.1 s
    assert rows[0][:2] == pytest.approx((0.0, 0.5)) and rows[1][:2] == pytest.approx((0.5, 1.1))
    # row 3, 35 ms after row 2: back to the newest row at least 1 s old (row 1 at 0.5 s)
    assert rows[2][:2] == pytest.approx((0.5, 1.135))
    assert rows[2][2] == pytest.approx(200 / 1.135)  # not 100 / 0.035
    assert rows[3][:2] == pytest.approx((1.635, 1.365))  # its own interval again
    assert rows[4][:2] == pytest.approx((1.635, 1.375))  # 10 ms after row 4: row 3 is the newest 1 s old
    assert all(r[1] >= min(1.0, r[0] + r[1]) - 1e-12 for r in rows)


def test_rows_of_several_updates_measure_from_the_previous_row():
    rows = _windows([0.0, 0.2, 1.4, 2.0, 3.5], every=2)
    assert [r[:2] for r in rows] == [pytest.approx((0.0, 1.4)), pytest.approx((1.4, 2.1))]


def test_the_window_reaches_back_to_the_newest_update_a_second_old_not_to_the_compilation():
    # compilation until 5.0 s, then updates every 0.3 s, a row every third update
    rows = _windows([0.0, 5.0, 5.3, 5.6, 5.9, 6.2, 6.5], every=3)
    assert rows[0][:2] == pytest.approx((0.0, 5.6))  # the first row: from the start, compilation included
    assert rows[1][:2] == pytest.approx((5.3, 1.2))  # the update at 5.3 s, not the run's start
    assert rows[1][2] == pytest.approx(400 / 1.2)
