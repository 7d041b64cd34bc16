"""Plane layouts and the `auto` lead, as pure logic (the llama.cpp side is in test_rollback.py)."""

from __future__ import annotations

import itertools

import pytest

from ggspec.bench.forced import profile_lengths
from ggspec.errors import InputError
from ggspec.speculative.planes import AutoLead, PlaneOptions, covered_accepts, default_lead


class FakeTarget:
    def __init__(self) -> None:
        self.layouts: list[tuple[int, int]] = []

    def set_rs_layout(self, planes: int, lead: int) -> None:
        self.layouts.append((planes, lead))


def test_seed_000_layouts():
    # the capped-planes design's example, n_max 7: 4 planes old = {5, 6, 7}; new = {0, 1, 7}; 3 new = {0, 7}; 5 new = {0, 1, 2, 7}
    assert covered_accepts(4, 0, 7) == {5, 6, 7}
    assert covered_accepts(4, default_lead(4), 7) == {0, 1, 7}
    assert covered_accepts(3, default_lead(3), 7) == {0, 7}
    assert covered_accepts(5, default_lead(5), 7) == {0, 1, 2, 7}
    assert covered_accepts(8, -1, 7) == set(range(8))  # uncapped (default layout) keeps everything
    assert covered_accepts(4, -1, 7) == {4, 5, 6, 7}  # capped default layout: no input plane either


def _run(profile, planes=4, steps=600):
    target = FakeTarget()
    auto = AutoLead(target, planes, 7)
    auto.start()
    for a in itertools.islice(profile_lengths(profile, 7, seed=1), steps):
        auto.observe(a, 7)
    return auto, target


def test_auto_keeps_the_default_for_dflash_acceptance():
    auto, target = _run("dflash")
    assert auto.lead == default_lead(4) and auto.changes == 0 and target.layouts == [(4, 2)]


def test_auto_moves_to_the_newest_states_for_mtp_like_acceptance():
    auto, target = _run("mtp")
    assert auto.lead == 0 and 1 <= auto.changes <= 2
    assert target.layouts[-1] == (4, 0)


@pytest.mark.parametrize("profile", ["uniform", "dflash", "mtp"])
def test_auto_does_not_flap(profile):
    auto, _ = _run(profile, planes=5, steps=2000)
    assert auto.changes <= 3, auto.changes


def test_auto_ignores_shortened_blocks():
    target = FakeTarget()
    auto = AutoLead(target, 4, 7)
    for _ in range(200):
        auto.observe(3, 4)  # the last block of a generation drafts fewer than n_max
    assert auto.hist.sum() == 0


@pytest.mark.parametrize("planes, lead, msg", [
    ("1", None, "must be 2..8"), ("9", None, "must be 2..8"), ("4", "3", "must be 0..2"),
    (None, "7", "must be 0..6"), ("x", None, "uncapped"), (None, "y", "'auto'"),
])
def test_plane_options_are_checked(planes, lead, msg):
    with pytest.raises(InputError, match=msg):
        PlaneOptions.parse(planes, lead).check(7)


def test_plane_options_parse():
    assert PlaneOptions.parse("uncapped", None) == PlaneOptions(None, "default")
    assert PlaneOptions.parse(4, "auto") == PlaneOptions(4, "auto")
    assert PlaneOptions.parse("5", "1").lead == 1
