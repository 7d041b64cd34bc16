"""A shortened soak of `ggspec serve` (scripts/soak.py runs the long one): four clients for 25
seconds mixing every kind of request, faults included (ggspec.bench.soak), on the tiny pair; then
each distinct greedy request alone on a fresh server."""

from __future__ import annotations

import pytest
from helpers.serving import LiveServer

from ggspec.bench import soak

SERVE = ("--pair", "tiny-coder", "-np", "4", "--spec-draft-n-max", "4")


def test_a_mixed_load_with_faults_leaves_every_answer_and_slot_clean(build_info):
    s = LiveServer(*SERVE)
    try:
        result = soak.run(s.url, clients=4, seconds=25, pid=s.proc.pid, seed=1, warmup_s=10)
        result.busy_slots_after = soak.busy_slots(s.url)
        health = s.health()
    finally:
        code, log = s.stop()
    assert code == 0, log[-2000:]
    kinds = {a.call.kind for a in result.answers}
    assert {"dead-end", "garbage", "drop", "completion-stream", "chat"} <= kinds, kinds  # the faults did happen
    fresh = LiveServer(*SERVE)
    try:
        soak.lone_answers(fresh.url, result)
    finally:
        fresh.stop()
    summary = result.summary()
    print(summary)
    assert result.unprovoked == [], summary["unprovoked"]
    assert result.mismatches() == [], summary["mismatches"]
    assert summary["greedy_checked"] >= 20
    assert result.busy_slots_after == 0 and health["slots_processing"] == 0 and health["requests_waiting"] == 0
    # (resident memory is reported, not judged, on a run this short: caches still fill; the long
    # soak judges it after its first minute)
    assert result.rss_growth() is not None


def test_the_mix_is_reproducible_and_every_kind_is_drawn():
    import random

    a = [soak.pick(random.Random(3)).key for _ in range(5)]
    b = [soak.pick(random.Random(3)).key for _ in range(5)]
    assert a == b
    rng = random.Random(0)
    assert {soak.pick(rng).kind for _ in range(2000)} == set(soak.KINDS)


@pytest.mark.parametrize("raw, text", [
    (b'{"choices": [{"index": 1, "text": "b"}, {"index": 0, "text": "a"}]}', "a\x00b"),
    (b'{"content": "x"}', "x"),
    (b'{"choices": [{"index": 0, "message": {"content": null, "tool_calls": [{"id": "1"}]}}]}', '[{"id": "1"}]'),
])
def test_answer_texts(raw, text):
    assert soak._whole_text(raw) == text
