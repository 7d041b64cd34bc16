"""ngram-map-k and ngram-map-k4v: llama.cpp's n-gram map drafters (common/ngram-map.cpp).

The rules on hand-made histories (quirks included); the CLI and `bench --native` run them. Their
drafts against llama.cpp's own loop (`--spec-type ngram-map-k[4v]`, patch 0009's dump) at every
position, greedy output against plain greedy output and B after A as B alone: tests/test_exactness.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_cli
from helpers.pairs import STACK, TARGET

from ggspec.errors import InputError
from ggspec.speculative.models import PairConfig
from ggspec.speculative.types.ngram_map import NgramMap, NgramMapOptions, NgramMapProposer, ngram_hash


def _draft(m: NgramMap, inp, sampled) -> list[int]:
    return m.draft(np.asarray(inp, dtype=np.int32), sampled).tolist()


# --- the rules ------------------------------------------------------------------------------------


def test_the_hash_is_llama_cpps_32_bit_lcg():
    assert ngram_hash([1, 2], 0, 2) == 2654435761 + 2
    assert ngram_hash([7, 1, 2], 1, 2) == 2654435763
    assert ngram_hash([70000] * 6, 0, 6) < 2**32


def test_key_only_drafts_what_followed_the_key_and_shrinks_to_what_was_accepted():
    m = NgramMap(2, 3, key_only=True, min_hits=1)
    inp = [5, 1, 2, 7, 8, 9, 3, 4, 1]
    assert _draft(m, inp, 2) == [7, 8, 9]  # the key [1, 2] (last token + id_last) at start 1
    m.accept(1)
    assert _draft(m, inp, 2) == [7]  # the key's next draft holds what its last one got accepted
    m.accept(0)
    assert _draft(m, inp, 2) == []  # (quirk) a wholly rejected key never drafts again
    assert _draft(m, inp[:6], 2) == []  # too short: fewer than 2 n + m tokens


def test_k4v_needs_min_hits_and_a_clear_winner_then_drafts_after_the_current_match():
    inp = [9, 5, 1, 2, 5, 1, 3, 8]  # key [5]: continuations [1, 2] and [1, 3], once each
    assert _draft(NgramMap(1, 2, key_only=True, min_hits=1), inp, 5) == [1, 3]  # the most recent match
    assert _draft(NgramMap(1, 2, key_only=False, min_hits=1), inp, 5) == []  # no clear winner
    assert _draft(NgramMap(1, 2, key_only=False, min_hits=2), inp, 5) == []  # one hit so far
    # [1, 2] twice and [1, 3] once: [1, 2] wins, but (quirk) the tokens after the current match,
    # the [1, 3] occurrence, are drafted
    assert _draft(NgramMap(1, 2, key_only=False, min_hits=1), [5, 1, 2, 5, 1, 2, 5, 1, 3, 0], 5) == [1, 3]


def test_bad_sizes_are_one_line():
    for kw, what in (({"size_n": 0}, "size_n"), ({"size_m": 1025}, "size_m"), ({"min_hits": 0}, "min_hits")):
        with pytest.raises(InputError, match=what):
            NgramMapProposer(True, **kw)
    with pytest.raises(InputError, match="minimum hits must be at least 1"):
        PairConfig(target=TARGET, spec_type="ngram-map-k4v",
                   spec_options={"ngram-map-k4v": NgramMapOptions(min_hits=0)}).validate()


def test_cli_runs_the_map_types():
    for spec_type in ("ngram-map-k", "ngram-map-k4v"):
        res = run_cli("run", "-m", str(TARGET), "--spec-type", spec_type, "--spec-ngram-map-k-size-n", "3",
                      "--spec-ngram-map-k4v-size-m", "8", "-p", STACK, "-n", "48", "--check")
        assert res.returncode == 0, res.stderr
        assert f"{spec_type} auto ≤ 8" in res.stderr and "identical" in res.stderr, res.stderr
    bad = run_cli("run", "-m", str(TARGET), "--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-min-hits", "0",
                  "-p", "x", "-n", "4")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "min-hits" in bad.stderr


@pytest.mark.parametrize("spec_type, flags", [
    ("ngram-simple", ["--spec-ngram-simple-size-n", "3"]),
    ("ngram-map-k4v", ["--spec-ngram-map-k4v-size-n", "3"]),
    ("ngram-mod", ["--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "2"]),
])
def test_bench_runs_the_ngram_types_beside_llama_cpps_loop(spec_type, flags, tmp_path):
    """`bench --native` gives every n-gram type llama.cpp's loop rows at the same settings: the
    same acceptance (τ within the budget's last steps) on all 12 built-in prompts."""
    import json

    out = tmp_path / "bench.json"
    res = run_cli("bench", "-m", str(TARGET), "--spec-type", spec_type, *flags, "--native", "--spec-draft-n-max",
                  "8", "-n", "48", "-r", "1", "--save", str(out), timeout=300)
    assert res.returncode == 0, res.stderr
    rows = {r["kind"]: r for r in json.loads(out.read_text())["rows"] if r["category"] == "all"}
    assert {"spec", "native"} <= set(rows)
    assert rows["spec"]["tau_pooled"] > 1.5
    assert rows["native"]["tau_pooled"] == pytest.approx(rows["spec"]["tau_pooled"], rel=0.03)
    assert rows["spec"]["identical"] == rows["native"]["identical"] == "12/12"
