"""Real-shape dummy models: shapes from published configs, the streaming writer, llama-quantize,
and the smallest dense and hybrid shapes run through both loops at Q4_K_M.

The tests marked `scale` make `dummy-qwen3-0.6b` and `dummy-qwen3.5-0.8b` once (about 2 minutes
and 2.5 GB in $GGSPEC_HOME/scale, F16 sources included) and reuse them; `-m 'not scale'` skips
them. Speed is never asserted here: `ggspec bench` on these pairs measures it.
"""

from __future__ import annotations

import json
import tracemalloc
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import PROMPTS, run_cli

from ggspec.catalogue import dummy
from ggspec.catalogue.pairs import catalog_path, check_files, get_entry, make
from ggspec.catalogue.shapes import load_shapes
from ggspec.errors import InputError
from ggspec.files import file_sha256
from ggspec.runtime.gguf_meta import read_meta

SHAPES = load_shapes(catalog_path())
DENSE, HYBRID = "dummy-qwen3-0.6b", "dummy-qwen3.5-0.8b"


# --- shapes and plans (no files) ----------------------------------------------------------------


def test_plans_have_the_published_parameter_counts():
    """z-lab/Qwen3.5-4B-DFlash: 634,425,856 parameters in 69 tensors (its SOURCE_LOCK); Qwen3's
    model cards: 0.6B = 0.44B non-embedding, 4B = 3.6B non-embedding."""
    draft = dummy.draft_plan(SHAPES["qwen3.5-4b-dflash"])
    assert sum(t.n for t in draft) == 634_425_856 and len(draft) == 69
    for name, non_embedding in (("qwen3-0.6b", 0.44e9), ("qwen3-4b", 3.6e9)):
        s = SHAPES[name]
        total = sum(t.n for t in dummy.target_plan(s))
        assert total - s.vocab_size * s.hidden_size == pytest.approx(non_embedding, rel=0.02), name


def test_every_draft_fits_its_target_and_follows_z_labs_layer_rule():
    """target_layer_ids = round(1 + i (L - 4) / (n - 1)) (z-lab/dflash build_target_layer_ids)."""
    drafts = [s for s in SHAPES.values() if s.arch == "dflash"]
    assert drafts
    for d in drafts:
        t = SHAPES[d.target]
        n, L = len(d.target_layer_ids), t.num_hidden_layers
        assert list(d.target_layer_ids) == [round(1 + i * (L - 4) / (n - 1)) for i in range(n)], d.name
        assert d.hidden_size == t.hidden_size and d.block_size == 16


def test_a_bad_shape_is_one_line(tmp_path):
    bad = tmp_path / "models.toml"
    good = (Path(__file__).resolve().parents[1] / "models.toml").read_text()
    body = good[good.index('[shapes."qwen3-0.6b"]'):].split("\n\n")[0].replace('[shapes."qwen3-0.6b"]', "[shapes.x]")
    bad.write_text(body.replace("vocab_size = 151936\n", ""))
    with pytest.raises(InputError, match="shape 'x': qwen3 shapes need vocab_size"):
        load_shapes(bad)
    bad.write_text(body.replace("hidden_size = 1024", "hidden_size = 0"))
    with pytest.raises(InputError, match="shape 'x': hidden_size must be a whole number of at least 1, not 0"):
        load_shapes(bad)
    bad.write_text('[shapes.x]\narch = "qwen3"\n')
    with pytest.raises(InputError, match="shape 'x': qwen3 shapes need hidden_size"):
        load_shapes(bad)
    bad.write_text('[shapes.d]\narch = "dflash"\ntarget = "nope"\nblock_size = 16\ntarget_layer_ids = [1]\n'
                   'hidden_size = 8\nintermediate_size = 8\nnum_hidden_layers = 1\nnum_attention_heads = 1\n'
                   'num_key_value_heads = 1\nhead_dim = 8\nrope_theta = 1.0\nmax_position_embeddings = 8\n'
                   'rms_norm_eps = 1e-6\nsource = "x"\n')
    with pytest.raises(InputError, match="target 'nope' is not a target shape"):
        load_shapes(bad)


def test_gemma4_shapes_make_files_that_run_in_both_loops(tmp_path, tool):
    """The writer's gemma4 target and gemma4-assistant layouts (narrowed and with a small
    vocabulary: the E2B dummy itself is made by scripts/mtp_gemma4_table.sh) load in llama.cpp,
    and draft-mtp with the drafter drafts what llama.cpp's loop drafts."""
    from helpers.drafts import compare, ggspec_drafts
    from helpers.pairs import MTP_CTX, MTP_N, MTP_PROMPT

    from ggspec.bench.native import run_cpp
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.models import PairConfig

    narrow = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 2, "head_dim": 64,
              "global_head_dim": 128, "vocab_size": 4096}
    e2b = SHAPES["gemma-4-e2b"]
    t = replace(e2b, name="g4", num_hidden_layers=10, layer_types=e2b.layer_types[:10], num_kv_shared_layers=5, **narrow)
    d = replace(SHAPES["gemma-4-e2b-assistant"], name="g4a", target="g4", backbone_hidden_size=256,
                **(narrow | {"hidden_size": 128, "intermediate_size": 256}))
    target, drafter = tmp_path / "t.gguf", tmp_path / "d.gguf"
    dummy.write_f16(target, t, None, seed=0)
    dummy.write_f16(drafter, d, t, seed=0)
    assert read_meta(drafter).arch_key("embedding_length_out") == 256
    assert read_meta(target).arch_key("feed_forward_length") == [512] * 5 + [1024] * 5  # double-wide shared layers
    with Engine.open(PairConfig(target=target, draft=drafter, n_max=3, ctx=MTP_CTX)) as eng:
        mine, _ = ggspec_drafts(eng, MTP_PROMPT, 3, forced=False)
    res = run_cpp(tool, target, drafter, MTP_PROMPT, MTP_N, 3, defer=False, spec_type="draft-mtp", dump_drafts=True)
    assert compare(mine, res.drafts, res.draft_anchors) >= len(mine) - 2


def _small(name: str, layers: int):
    return replace(SHAPES[name], name=f"{name}-small", num_hidden_layers=layers)


def test_writer_is_deterministic_and_streams(tmp_path):
    """Same shape and seed -> the same bytes; another seed -> other bytes; the writer never holds
    more than a chunk: the 151,936-row embedding alone is 311 MB at F16."""
    s = _small("qwen3-0.6b", 1)
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    tracemalloc.start()
    dummy.write_f16(a, s, None, seed=0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert a.stat().st_size > 300e6 and peak < 200e6, peak
    dummy.write_f16(b, s, None, seed=0)
    dummy.write_f16(c, s, None, seed=1)
    assert file_sha256(a) == file_sha256(b) != file_sha256(c)


def test_a_pair_that_does_not_fit_is_refused_up_front(tmp_path, monkeypatch):
    monkeypatch.setenv("GGSPEC_HOME", str(tmp_path))
    monkeypatch.setattr(dummy, "_mem_available", lambda: 4 << 30)
    with pytest.raises(dummy.MakeError, match=r"needs about \d+\.\d GiB of memory to run; this machine has 4\.0 GiB"):
        make(get_entry("dummy-qwen3-4b@f16"))
    assert not dummy.is_made(dummy.model_path(SHAPES["qwen3-4b"], 0, "f16"))  # nothing was written


def test_type_suffix_and_not_made_messages(tmp_path, monkeypatch):
    monkeypatch.setenv("GGSPEC_HOME", str(tmp_path))  # nothing made here
    entry = get_entry("dummy-qwen3-1.7b@q8_0")
    assert entry.quant == "q8_0" and check_files(entry, None) == "not made"
    proc = run_cli("run", "--pair", "dummy-qwen3-1.7b@q8_0", "-n", "4", env={"GGSPEC_HOME": str(tmp_path)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "has not been made yet (`ggspec models make dummy-qwen3-1.7b@q8_0` writes" in proc.stderr
    for bad, why in (("dummy-qwen3-0.6b@q3", "unknown file type 'q3'"), ("tiny-coder@f16", "only dummy pairs")):
        proc = run_cli("run", "--pair", bad, "-n", "4")
        assert proc.returncode == 1 and why in proc.stderr and "Traceback" not in proc.stderr


# --- the smallest shapes, made and run ----------------------------------------------------------


@pytest.fixture(scope="session")
def made(build_info) -> dict[str, object]:
    """The two smallest dummy pairs at Q4_K_M (made on first use, then cached)."""
    return {name: make(get_entry(name)) for name in (DENSE, HYBRID)}


@pytest.mark.scale
@pytest.mark.parametrize("name", [DENSE, HYBRID])
def test_files_carry_the_recorded_config(made, name):
    entry = get_entry(name)
    files = made[name]
    t, d = SHAPES[entry.target_shape], SHAPES[entry.draft_shape]
    meta = read_meta(files.target)
    arch = meta.arch
    assert arch == t.arch and meta.get("general.file_type") == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert meta.arch_key("embedding_length") == t.hidden_size
    assert meta.arch_key("feed_forward_length") == t.intermediate_size
    assert meta.arch_key("block_count") == t.num_hidden_layers + t.mtp_num_hidden_layers
    assert meta.n_layer_main == t.num_hidden_layers and meta.n_nextn == t.mtp_num_hidden_layers
    assert (meta.arch_key("attention.head_count"), meta.arch_key("attention.head_count_kv"),
            meta.arch_key("attention.key_length")) == (t.num_attention_heads, t.num_key_value_heads, t.head_dim)
    assert meta.arch_key("rope.freq_base") == pytest.approx(t.rope_theta)
    assert meta.arch_key("context_length") == t.max_position_embeddings
    assert meta.n_vocab == t.vocab_size
    if arch == "qwen35":
        assert meta.arch_key("full_attention_interval") == t.full_attention_interval
        assert meta.arch_key("ssm.time_step_rank") == t.linear_num_value_heads
        assert meta.arch_key("ssm.group_count") == t.linear_num_key_heads
        assert meta.arch_key("rope.dimension_count") == t.n_rot == 64
    dm = read_meta(files.draft)
    assert dm.arch == "dflash" and dm.get("general.file_type") == 7  # Q8_0 beside a quantized target
    assert list(dm.arch_key("target_layers")) == [i + 1 for i in d.target_layer_ids]
    assert dm.arch_key("block_size") == 16 and dm.arch_key("block_count") == d.num_hidden_layers
    assert dm.arch_key("embedding_length") == t.hidden_size
    record = json.loads(files.target.with_suffix(".json").read_text())
    assert record["sha256"] == file_sha256(files.target) and record["source"] == t.source
    assert "llama-quantize Q4_K_M" in record["made_by"]


def _forced_runs(name: str, made, *, planes: str | None = None, n_predict: int = 40):
    from ggspec.bench.forced import ForcedAcceptance, cycle_lengths
    from ggspec.runtime import ContextParams
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.lossless import run_prompts
    from ggspec.speculative.models import PairConfig
    from ggspec.speculative.planes import PlaneOptions

    files = made[name]
    cfg = PairConfig(target=files.target, draft=files.draft, n_max=7, ctx=ContextParams(n_ctx=1024, n_threads=2),
                     planes=PlaneOptions.parse(planes, "0" if planes else None))
    with Engine.open(cfg) as sp:
        def forced(_prompt, plain):
            ref = list(_prompt) + list(plain) + [0] * 8
            return ForcedAcceptance(sp.proposer, ref, cycle_lengths(7), sp.target_model.n_vocab)
        return list(run_prompts(sp, PROMPTS[:3], n_predict, forced))


@pytest.mark.scale
@pytest.mark.parametrize("name, planes", [(DENSE, None), (HYBRID, None), (HYBRID, "3")])
def test_forced_speculation_equals_plain_greedy(made, name, planes):
    """Every acceptance length 0..7 in turn; capped planes (3, newest states kept) make most steps
    replay. The initialisation keeps the greedy path far from ties: no divergence of any kind, and
    the margins are hundreds of nats."""
    runs = _forced_runs(name, made, planes=planes)
    for r in runs:
        assert r.divergence is None, r.divergence.describe()
        assert min(r.margins) > 50
        assert r.spec_stats.spec_steps and r.spec_stats.tau > 3  # forced: 0..7 accepted in turn
        if planes:
            assert r.spec_stats.replay_share > 0


@pytest.mark.scale
@pytest.mark.parametrize("name", [DENSE, HYBRID])
def test_forced_counts_equal_llama_cpp_s_loop(made, name, tmp_path):
    """`bench --acceptance-profile dflash --native`: llama.cpp's own loop (patch 0005) and ggspec's
    accept the same count at every step (the same histogram), and every output is identical to
    plain greedy, labelled as forced."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "category": "c"}) + "\n" for p in PROMPTS[:2]))
    proc = run_cli("bench", "--pair", name, "--native", "--acceptance-profile", "dflash", "-r", "1", "-n", "32",
                   "-t", "2", "--no-warmup", "--prompts", str(prompts), "-o", "jsonl", "--spec-draft-n-max", "7",
                   timeout=900)
    assert proc.returncode == 0, proc.stderr
    rows = {(r["kind"], r["inject"]): r for r in map(json.loads, proc.stdout.splitlines()) if r["category"] == "all"}
    ours = rows[("spec", "pruned")]
    assert ours["acceptance_profile"] == "dflash"
    for mode in ("immediate", "deferred"):
        theirs = rows[("native", mode)]
        assert theirs["accept_hist"] == ours["accept_hist"], mode
        assert theirs["steps"] == ours["steps"]
    for r in (rows[k] for k in rows if k[0] != "baseline"):  # llama.cpp's plain row is checked too
        assert r["identical"] == "2/2" and r["near_ties"] == 0 and r["real_divergences"] == 0, r["label"]
