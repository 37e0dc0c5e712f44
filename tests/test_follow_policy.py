"""The reconnect policy of the Ray log follower (trajsft.cluster.follow), on a fake transport: the
websocket tail is retried every poll_s, three drops in a row without data switch to polling, a drop
after data does not count, a dashboard outage is ridden out within the grace window, and a stop
request ends the wait between attempts."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from trajsft.cluster import follow
from trajsft.cluster.jobs import ClusterUnreachable, FollowInterrupted

DOWN = ConnectionError("websocket closed")


class FakeConn:
    """``sessions``: what each websocket session yields (an exception item is raised); ``status(conn)``
    gives the job status (or raises); ``job_logs`` returns ``full``."""

    address = "http://fake:8265"

    def __init__(self, sessions, status, full=""):
        self.sessions, self.full, self._status = list(sessions), full, status
        self.client = self
        self.tails = self.status_calls = self.log_calls = 0

    def job_info(self, job_id):
        return SimpleNamespace(submission_id=job_id, start_time=1, status="RUNNING")

    async def tail_job_logs(self, job_id):
        self.tails += 1
        for item in (self.sessions.pop(0) if self.sessions else [DOWN]):
            if isinstance(item, Exception):
                raise item
            yield item

    def status(self, job_id):
        self.status_calls += 1
        return self._status(self)

    def job_logs(self, job_id):
        self.log_calls += 1
        return self.full


def run(conn, tmp_path, **kw):
    return follow.follow(conn.address, "raysubmit_x", tmp_path / "job.log", kw.pop("poll_s", 0.01), _conn=conn, **kw)


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "trajsft.rayjobs" and r.levelno == logging.WARNING]


def test_three_empty_drops_in_a_row_switch_to_polling(tmp_path, caplog):
    conn = FakeConn([[DOWN]] * 3, lambda c: "SUCCEEDED" if c.log_calls else "RUNNING", full="line 1\nline 2\n")
    assert run(conn, tmp_path) == "SUCCEEDED"
    assert conn.tails == 3
    assert warnings(caplog) == ["log tail for raysubmit_x interrupted (websocket closed); reconnecting"] * 3 + [
        "log tail for raysubmit_x keeps failing; polling get_job_logs instead"]
    assert "line 1\nline 2\n[trajsft] Ray job raysubmit_x finished: SUCCEEDED" in (tmp_path / "job.log").read_text()


def test_a_drop_after_data_does_not_count(tmp_path, caplog):
    sessions = [[DOWN], [DOWN], ["a\n", DOWN], [DOWN], [DOWN], ["a\n", "b\n"]]
    # (a polling follower ends too, so that a wrong count fails rather than hangs)
    conn = FakeConn(sessions, lambda c: "SUCCEEDED" if c.log_calls or c.tails == 6 and not c.sessions else "RUNNING",
                    full="a\nb\n")
    assert run(conn, tmp_path) == "SUCCEEDED"
    assert conn.tails == 6  # never three empty drops in a row: no polling
    assert "keeps failing" not in " ".join(warnings(caplog)) and len(warnings(caplog)) == 5
    text = (tmp_path / "job.log").read_text()
    assert text.count("a\n") == 1 and "a\nb\n[trajsft] Ray job raysubmit_x finished" in text  # no duplicates


def test_a_tail_that_ends_before_the_job_is_reopened_without_counting(tmp_path, caplog):
    conn = FakeConn([["a\n"]] * 5, lambda c: "FAILED" if c.log_calls or c.tails == 5 and not c.sessions else "RUNNING")
    assert run(conn, tmp_path) == "FAILED"
    assert conn.tails == 5 and warnings(caplog) == []


def outage(calls: int):
    def status(c):
        if c.status_calls <= calls:
            raise ClusterUnreachable("Ray dashboard http://fake:8265 unreachable")
        return "SUCCEEDED"
    return status


def test_a_short_dashboard_outage_is_ridden_out(tmp_path, caplog):
    conn = FakeConn([[DOWN]] * 10, outage(4), full="x\n")
    assert run(conn, tmp_path, unreachable_grace_s=60) == "SUCCEEDED"
    assert [w for w in warnings(caplog) if "retrying for up to" in w] == [
        "Ray dashboard http://fake:8265 unreachable; retrying for up to 60s"]  # once per outage


def test_a_long_dashboard_outage_raises(tmp_path):
    conn = FakeConn([[DOWN]] * 1000, outage(10**6))
    with pytest.raises(ClusterUnreachable, match="unreachable"):
        run(conn, tmp_path, unreachable_grace_s=0.3)
    assert conn.status_calls >= 3  # retried for the grace window, every poll_s


def test_a_stop_request_ends_the_wait_between_attempts(tmp_path):
    conn = FakeConn([[DOWN]] * 10, lambda c: "RUNNING")
    t0 = time.monotonic()
    with pytest.raises(FollowInterrupted):
        run(conn, tmp_path, poll_s=30, should_stop=lambda: conn.tails >= 1)
    assert conn.tails == 1 and time.monotonic() - t0 < 10  # well before the 30 s wait ends
