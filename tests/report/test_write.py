"""`ksearch.report.html.write_html`: where ``-o`` cannot take a page, one error and nothing replaced or left behind
(a device or a FIFO was renamed over: ``-o /dev/full`` as root replaced the device with the page)."""

from __future__ import annotations

import os

import pytest

from ksearch.errors import ReportError
from ksearch.report.html import write_html


def test_a_page_is_written_whole_and_rewritten(tmp_path):
    out = tmp_path / "missing" / "r.html"
    write_html(out, "one")
    write_html(out, "two")
    assert out.read_text() == "two" and os.listdir(out.parent) == ["r.html"]


def test_a_directory_or_a_fifo_is_refused_and_left_as_it_was(tmp_path):
    fifo = tmp_path / "pipe.html"
    os.mkfifo(fifo)
    with pytest.raises(ReportError, match="is a directory"):
        write_html(tmp_path, "page")
    with pytest.raises(ReportError, match="not a regular file"):
        write_html(fifo, "page")
    assert fifo.is_fifo() and sorted(os.listdir(tmp_path)) == ["pipe.html"]
