"""bench/processor.py: the coordinator's clock runs without its own garbage collector."""

from __future__ import annotations

import gc

import pytest

from bench import processor


def test_the_measuring_window_turns_the_coordinators_collector_off_and_back_on() -> None:
    assert gc.isenabled()
    with processor.measuring_window():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), processor.measuring_window():
        raise RuntimeError("a case failed")
    assert gc.isenabled()  # a failed case leaves the collector as it found it


def test_the_measuring_window_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with processor.measuring_window():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
