"""DFlash2 and DSpark draft fixtures (helpers.fixtures.variants) and the C++ reference tooling they
are checked against: llama.cpp's own speculative loop (llama-speculative-simple, `--spec-type
draft-dflash | draft-dspark | ngram-simple`) with patch 0009's dump of every draft call.

The native tests need the `--tools` build, like the other native tests (docs/getting-started.md:
the test command builds `--tools`); without it they fail with find_tool's one-line message.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import PROMPTS
from helpers.fixtures.variants import base_pair, ensure_variant, write_dflash2_draft, write_dspark_draft

from ggspec.bench.native import PLAIN_TOOL, CppResult, find_tool, parse_drafts, run_cpp, run_plain
from ggspec.errors import InputError, LlamaError
from ggspec.files import file_sha256
from ggspec.runtime import Batch, Context, ContextParams, Model
from ggspec.speculative.driver import generate_greedy, generate_spec
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.types.ngram import NgramSimpleOptions

PROMPT = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
N = 128
N_MAX = 7
TOP_K = 4  # write_dflash2_draft's default
SPEC_TYPE = {"dflash2": "draft-dflash", "dspark": "draft-dspark"}
CTX = ContextParams(n_ctx=2048, n_batch=2048, n_ubatch=512, type_k="f16", type_v="f16", flash_attn="off")


@pytest.fixture(scope="module")
def coder(fixture_dir, build_info):
    """The variants built on the trained tiny-coder draft: {"dflash2": pair, "dspark": pair}."""
    return {v: ensure_variant(fixture_dir, v, "tiny-coder") for v in SPEC_TYPE}


@pytest.fixture(scope="module")
def plain_text(coder, build_info) -> str:
    """llama.cpp's plain greedy text of PROMPT on the tiny-coder target (llama-completion)."""
    return run_plain(find_tool(PLAIN_TOOL), coder["dflash2"].target, PROMPT, N).text


@pytest.fixture(scope="module")
def greedy_ids(coder) -> list[int]:
    """Prompt + plain greedy continuation of PROMPT as token ids (ggspec's runtime), indexed by
    position; a few tokens longer than N, since the loop's last step may commit past -n."""
    with Engine.open(PairConfig(target=coder["dflash2"].target, ctx=CTX)) as eng:
        prompt = eng.target_model.tokenize(PROMPT)
        out = [int(t) for t in prompt]
        for step in generate_greedy(eng, prompt, N + N_MAX + 2, ignore_eos=True):
            out += step.tokens
    return out


# --- the files ------------------------------------------------------------------------------------


def _meta(path: Path) -> tuple[dict, dict]:
    r = gguf.GGUFReader(str(path))
    keys = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    return keys, {t.name: [int(x) for x in t.shape] for t in r.tensors}


def test_variant_files_keep_the_base_and_add_the_heads(coder):
    base_keys, base_tensors = _meta(base_pair("tiny-coder").draft)
    for variant, pair in coder.items():
        keys, tensors = _meta(pair.draft)
        assert {k: v for k, v in base_tensors.items()} == {k: tensors[k] for k in base_tensors}
        assert all(keys[k] == v for k, v in base_keys.items() if k not in ("general.name", "GGUF.kv_count",
                                                                            "GGUF.tensor_count"))
        extra = set(tensors) - set(base_tensors)
        if variant == "dflash2":
            assert keys["dflash.selector_top_k"] == TOP_K and keys["dflash.selector_rank"] == 16
            assert keys["dflash.conv_kernel_size"] == 3 and keys["dflash.conv_group_size"] == 32
            assert tensors["selector_hidden.weight"] == [128, 16]
            assert tensors["selector_predecessor.weight"] == tensors["selector_successor.weight"] == [16, 1024]
            assert tensors["blk.1.attn_conv_base"] == [128, 3, 2] and tensors["blk.0.ffn_conv_proj.weight"] == [128, 24]
            assert len(extra) == 3 + 4 * 2
        else:
            assert keys["dflash.sample_from_anchor"] is False and keys["dflash.has_confidence_head"] is True
            assert extra == {"markov_w1.weight", "markov_w2.weight", "conf_proj.weight", "conf_proj.bias"}
            assert tensors["conf_proj.weight"] == [128 + 16, 1]
        assert pair.draft.stat().st_size < 2_200_000  # small: the base draft is 1.8 MB


def test_writers_are_deterministic_and_check_their_arguments(coder, tmp_path):
    base = base_pair("tiny-coder").draft
    a = write_dflash2_draft(tmp_path / "a.gguf", base, seed=3)
    b = write_dflash2_draft(tmp_path / "b.gguf", base, seed=3)
    c = write_dflash2_draft(tmp_path / "c.gguf", base, seed=4)
    assert file_sha256(a) == file_sha256(b) != file_sha256(c)
    d = write_dspark_draft(tmp_path / "d.gguf", base, seed=3)
    assert file_sha256(d) == file_sha256(write_dspark_draft(tmp_path / "e.gguf", base, seed=3))
    with pytest.raises(ValueError, match="does not divide"):
        write_dflash2_draft(tmp_path / "x.gguf", base, conv_group=48)
    with pytest.raises(ValueError, match="too small for top_k"):
        write_dflash2_draft(tmp_path / "x.gguf", base, top_k=11)
    with pytest.raises(ValueError, match="not a DFlash draft"):
        write_dspark_draft(tmp_path / "x.gguf", coder["dspark"].target)
    assert not (tmp_path / "x.gguf").exists()


# --- through ggspec's runtime ---------------------------------------------------------------------


def _first_block(target: Model, draft: Model, prompt: str, dflash2: bool) -> tuple[int, int, np.ndarray, np.ndarray]:
    """What llama.cpp's loop computes for its first draft call: the prompt but its last token
    decoded by the target, its layer inputs injected into the draft, then the noise block
    [id_last, MASK x N_MAX] at the next positions. Returns (pos of id_last, id_last, the block's
    logits, its nextn rows)."""
    lc = target.lc
    layers = [int(lc._lib.ggspec_model_target_layer_ids(draft.ptr)[k])
              for k in range(lc._lib.ggspec_model_target_layer_ids_n(draft.ptr))]
    tokens = target.tokenize(prompt)
    n = len(tokens)
    with Context(target, CTX) as tgt, Batch(tgt) as tb:
        tgt.enable_layer_inputs(layers)
        tgt.decode(tb.add_tokens(tokens[:-1], 0, outputs="none"))
        with Context(draft, CTX, ctx_other=tgt, what="draft") as dft, Batch(dft) as db:
            dft.set_causal_attn(False)
            # DFlash2's lattice is unmasked (a row per batch token), DSpark's confidence masked
            lc._lib.ggspec_set_embeddings_nextn(dft.ptr, True, not dflash2)
            dft.decode(db.add_layer_inputs(tgt, layers, 0, n - 1, 0))
            block = [int(tokens[-1])] + [int(lc.llama_vocab_mask(draft.vocab))] * N_MAX
            dft.decode(db.clear().add_tokens(block, n - 1, outputs="all"))
            E = draft.n_embd
            if dflash2:
                rows = np.ctypeslib.as_array(lc._lib.ggspec_get_embeddings_nextn(dft.ptr), shape=(len(block), E)).copy()
            else:
                rows = np.stack([np.ctypeslib.as_array(lc._lib.ggspec_get_embeddings_nextn_ith(dft.ptr, i), shape=(E,))
                                 for i in range(len(block))])
            return n - 1, int(tokens[-1]), dft.logits(), rows


def _walk(lattice: np.ndarray, top_k: int) -> list[int]:
    """llama.cpp's DFlash2 walk (common/speculative.cpp): row i holds the top-k candidate ids, then
    a top_k x top_k score table indexed [predecessor][successor]; row 0 is the anchor's."""
    pred, out = 0, []
    for row in lattice[1:]:
        scores = row[top_k + pred * top_k: top_k + (pred + 1) * top_k]
        pred = int(np.argmax(scores))
        out.append(int(row[pred]))
    return out


@pytest.fixture(scope="module")
def first_blocks(coder):
    """The first noise block of every PROMPTS entry (and PROMPT) per variant, through the runtime."""
    out = {}
    with Model(coder["dflash2"].target) as target:
        for variant, pair in coder.items():
            with Model(pair.draft, what="draft") as draft:
                top_k = target.lc._lib.ggspec_model_dflash_selector_top_k(draft.ptr)
                out[variant] = (top_k, [_first_block(target, draft, p, variant == "dflash2") for p in [PROMPT, *PROMPTS]])
    return out


def test_dflash2_lattice_walk_differs_from_argmax_sometimes(first_blocks):
    top_k, blocks = first_blocks["dflash2"]
    assert top_k == TOP_K
    differ = total = 0
    for _pos, _id_last, logits, lattice in blocks:
        cands = lattice[1:, :top_k]
        assert np.array_equal(cands, np.round(cands)) and (cands >= 0).all() and (cands < 1024).all()
        # the candidates are the top-k of the draft's logits (in no particular order)
        for i, row in enumerate(cands, 1):
            assert set(row.astype(int)) == set(np.argsort(-logits[i])[:top_k].tolist())
        assert not lattice[:, top_k + top_k * top_k:].any()  # the rest of each row is zero padding
        walk = _walk(lattice, top_k)
        differ += sum(w != a for w, a in zip(walk, logits[1:].argmax(axis=1)))
        total += len(walk)
    # the selector matters, but the trained draft's choice still dominates
    assert 0.05 * total < differ < 0.5 * total, (differ, total)


def test_dspark_confidence_spans_both_sides_of_one_half(first_blocks):
    top_k, blocks = first_blocks["dspark"]
    assert top_k == 0  # DSpark is no DFlash2
    conf = []
    for _pos, _id_last, _logits, rows in blocks:
        assert np.array_equal(rows, np.repeat(rows[:, :1], rows.shape[1], axis=1))  # broadcast per slot
        conf += rows[1:, 0].tolist()  # slot 0 (the bonus anchor) is never read
    conf = np.array(conf)
    assert ((conf > 0) & (conf < 1)).all()
    assert 0.05 < np.mean(conf < 0.5) < 0.6, np.round(conf, 3)
    assert conf.min() < 0.2 and conf.max() > 0.9


@pytest.mark.parametrize("variant", ["dflash2", "dspark"])
def test_the_runtime_s_first_draft_is_llama_cpp_s(variant, coder, tool, first_blocks):
    """The runtime's first noise block, read the way common/speculative.cpp reads it, proposes
    exactly the first draft of llama.cpp's loop (patch 0009's dump)."""
    top_k, blocks = first_blocks[variant]
    pos, id_last, logits, rows = blocks[0]
    mine = _walk(rows, top_k) if variant == "dflash2" else logits[1:].argmax(axis=1).tolist()
    res = run_cpp(tool, coder[variant].target, coder[variant].draft, PROMPT, 16, N_MAX, defer=False,
                  spec_type=SPEC_TYPE[variant], dump_drafts=True)
    assert res.drafts[0] == (pos, mine) and res.draft_anchors[0] == id_last


# --- llama.cpp's own loop ---------------------------------------------------------------------


def _check_dump(res: CppResult, seq: list[int], n_max: int) -> list[int]:
    """The dump agrees with the loop's counts and with plain greedy decoding: every call drafts
    from the committed token at its position, the target accepts exactly the draft's leading run
    that matches greedy decoding, and the next call starts right after. Returns the accepted
    count of every call but the last."""
    assert res.drafts and len(res.drafts) == len(res.draft_anchors)
    assert sum(len(d) for _, d in res.drafts) == res.drafted  # a dense target verifies every draft
    accepted = []
    for i, ((pos, draft), id_last) in enumerate(zip(res.drafts, res.draft_anchors)):
        assert id_last == seq[pos], f"call {i}: id_last {id_last} is not the committed token at {pos}"
        assert len(draft) <= n_max
        run = 0
        while run < len(draft) and draft[run] == seq[pos + 1 + run]:
            run += 1
        if i + 1 < len(res.drafts):
            assert res.drafts[i + 1][0] == pos + 1 + run, f"call {i} at {pos}: {run} of {draft} match greedy"
            accepted.append(run)
    assert sum(accepted) <= res.accepted <= sum(accepted) + len(res.drafts[-1][1])
    return accepted


def _budget(pos: int, n_prompt: int) -> int:
    """The draft length llama-speculative-simple allows a call at `pos` (id_last's position): -n
    minus the tokens committed so far minus one, N_MAX when that is 0 or less (the loop then
    does not cut at all: common_speculative_draft truncates only for n_max > 0)."""
    left = N - (pos - (n_prompt - 1)) - 1
    return min(N_MAX, left) if left > 0 else N_MAX


@pytest.mark.parametrize("variant,p_min", [("dflash2", None), ("dspark", None), ("dspark", 0.5)])
def test_llama_cpp_loop_runs_the_variant(variant, p_min, coder, tool, plain_text, greedy_ids):
    res = run_cpp(tool, coder[variant].target, coder[variant].draft, PROMPT, N, N_MAX, defer=False,
                  spec_type=SPEC_TYPE[variant], p_min=p_min, dump_drafts=True)
    assert res.text.startswith(plain_text.rstrip("\n"))  # the loop may commit a few tokens past -n
    accepted = _check_dump(res, greedy_ids, N_MAX)
    lengths = {len(d) for _, d in res.drafts}
    n_prompt = len(greedy_ids) - (N + N_MAX + 2)
    if p_min is None:
        # no confidence threshold: always the full draft, unless the -n budget cuts it
        assert all(len(d) == _budget(pos, n_prompt) for pos, d in res.drafts), res.drafts
        assert res.accepted > 0.4 * res.drafted  # built on the trained draft: mostly accepted
    else:
        # the confidence head truncates drafts: some empty, some full
        assert 0 in lengths and N_MAX in lengths and len(lengths) > 2
        assert all(len(d) <= _budget(pos, n_prompt) for pos, d in res.drafts)
        assert res.accepted > 0.5 * res.drafted
    assert any(a == N_MAX for a in accepted) and any(a < N_MAX for a in accepted)


@pytest.mark.parametrize("variant", ["dflash2", "dspark"])
def test_deferred_injection_drafts_the_same(variant, coder, tool):
    """Patch 0003's deferred injection proposes exactly the immediate path's drafts."""
    runs = [run_cpp(tool, coder[variant].target, coder[variant].draft, PROMPT, 64, N_MAX, defer=defer,
                    spec_type=SPEC_TYPE[variant], dump_drafts=True) for defer in (False, True)]
    assert runs[0].drafts == runs[1].drafts and runs[0].text == runs[1].text


def test_ngram_simple_runs_without_a_draft(coder, tool, plain_text, greedy_ids):
    res = run_cpp(tool, coder["dflash2"].target, None, PROMPT, N, N_MAX, defer=False, spec_type="ngram-simple",
                  options={"ngram-simple": NgramSimpleOptions(size_n=2, size_m=N_MAX)}, dump_drafts=True)
    assert res.text.startswith(plain_text.rstrip("\n"))
    _check_dump(res, greedy_ids, N_MAX)
    assert res.drafted > 0 and res.accepted > 0
    assert any(not d for _, d in res.drafts)  # a call without a match drafts nothing


@pytest.mark.parametrize("variant", ["dflash2", "dspark"])
def test_variants_of_the_random_dense_pair_run(variant, fixture_dir, tool):
    pair = ensure_variant(fixture_dir, variant, "dense")
    with Model(pair.draft, what="draft") as draft:
        assert draft.lc._lib.ggspec_model_dflash_selector_top_k(draft.ptr) == (TOP_K if variant == "dflash2" else 0)
    plain = run_plain(find_tool(PLAIN_TOOL), pair.target, PROMPT, 48).text
    res = run_cpp(tool, pair.target, pair.draft, PROMPT, 48, N_MAX, defer=False, spec_type=SPEC_TYPE[variant],
                  p_min=0.5 if variant == "dspark" else None, dump_drafts=True)
    assert res.text.startswith(plain.rstrip("\n")) and res.drafts
    assert sum(len(d) for _, d in res.drafts) == res.drafted


def test_run_cpp_checks_the_speculative_type(tool, coder):
    t, d = coder["dflash2"].target, coder["dflash2"].draft
    with pytest.raises(InputError, match="takes no draft"):
        run_cpp(tool, t, d, PROMPT, 8, 3, defer=False, spec_type="ngram-simple")
    with pytest.raises(InputError, match="needs a draft"):
        run_cpp(tool, t, None, PROMPT, 8, 3, defer=False, spec_type="draft-dspark")
    with pytest.raises(InputError, match="unknown speculative type"):
        run_cpp(tool, t, d, PROMPT, 8, 3, defer=False, spec_type="draft-medusa")
    # without dump_drafts nothing is dumped
    res = run_cpp(tool, t, base_pair("tiny-coder").draft, PROMPT, 16, 3, defer=False, spec_type="draft-dflash")
    assert res.drafts == [] and res.drafted > 0


def test_parse_drafts():
    drafts, anchors = parse_drafts("30 309 : 263 353\n33 632 :\n")
    assert drafts == [(30, [263, 353]), (33, [])] and anchors == [309, 632]
    for bad in ("30 309 263", "30 : 1", "x 1 : 2", "30 309 : 2 y"):
        with pytest.raises(LlamaError, match="line 1"):
            parse_drafts(bad)


# --- ggspec's own proposers against llama.cpp's loop --------------------------------------------


class Recording:
    """Wraps the engine's proposer and keeps every draft it makes: (position of id_last, tokens)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[tuple[int, list[int]]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, seqs, n):
        drafts = self.inner.propose(seqs, n)
        self.calls += [(seq.pos, d.tokens.tolist()) for seq, d in zip(seqs, drafts)]
        return drafts


def _prompt_tokens(target: Path) -> np.ndarray:
    with Model(target) as m:
        return m.tokenize(PROMPT)


def _ggspec_drafts(target: Path, draft: Path, p_min: float | None) -> tuple[list, float, str]:
    cfg = PairConfig(target=target, draft=draft, n_max=N_MAX, p_min=p_min or 0.0, ctx=CTX)
    with Engine.open(cfg) as eng:
        rec = Recording(eng.proposer)
        steps = list(generate_spec(eng, eng.target_model.tokenize(PROMPT), N, ignore_eos=True, proposer=rec))
        spec = [s for s in steps if s.kind == "spec"]
        tau = sum(s.accepted + 1 for s in spec) / len(spec)
        return rec.calls, tau, eng.plan.meta.variant


@pytest.fixture(scope="module")
def anchor_first(coder, tmp_path_factory):
    """A DSpark draft whose block is anchor-first (llama.cpp's default: rows 0..n-1 are the drafts)."""
    path = tmp_path_factory.mktemp("anchor") / "dspark-anchor.gguf"
    return write_dspark_draft(path, base_pair("tiny-coder").draft, sample_from_anchor=True)


@pytest.mark.parametrize("variant,p_min", [("dflash2", None), ("dflash2", 0.6), ("dspark", None), ("dspark", 0.5),
                                           ("anchor-first", None), ("anchor-first", 0.5)])
def test_ggspec_drafts_the_same_tokens_as_llama_cpp(variant, p_min, coder, tool, anchor_first):
    """Every draft ggspec's proposer makes at a position where llama.cpp's loop drafted a full
    block too is the same tokens (DFlash2's selector walk, DSpark's Markov-biased block and its
    confidence cut-off); the steps land on the same positions, so τ is the same."""
    target = coder["dflash2"].target
    draft = anchor_first if variant == "anchor-first" else coder[variant].draft
    spec_type = "draft-dflash" if variant == "dflash2" else "draft-dspark"
    mine, tau, kind = _ggspec_drafts(target, draft, p_min)
    assert kind == ("dflash2" if variant == "dflash2" else "dspark")
    res = run_cpp(tool, target, draft, PROMPT, N, N_MAX, defer=False, spec_type=spec_type, p_min=p_min,
                  dump_drafts=True)
    theirs = dict(res.drafts)
    # away from the end of the budget both ask for full blocks: compare those calls one by one
    full = [(pos, d) for pos, d in mine[:-3]]
    end = len(_prompt_tokens(target)) - 1 + N  # the position after which -n allows nothing
    assert len(full) > 10
    for pos, d in full:
        assert pos in theirs, f"llama.cpp never drafted at position {pos} (its calls: {sorted(theirs)[:20]}...)"
        # near the end llama.cpp cuts a full block's drafts to the budget before its dump; ggspec
        # cuts them after the proposer (both draft the same full block)
        cut = len(theirs[pos]) < len(d) and pos + len(theirs[pos]) + 1 >= end
        assert theirs[pos] == (d[:len(theirs[pos])] if cut else d), f"position {pos}: ggspec {d}, llama.cpp {theirs[pos]}"
    # the same steps in the same places: the same acceptance, up to the budget's last steps
    assert [pos for pos, _ in full] == [pos for pos, _ in res.drafts[:len(full)]]
    their_tau = 1 + res.accepted / sum(1 for _, d in res.drafts if d)  # τ over steps that drafted
    assert tau == pytest.approx(their_tau, abs=0.3), (tau, their_tau)
    if p_min is not None:
        assert any(len(d) < N_MAX for _, d in full)  # the cut-off did cut


def _accepted(draft: list[int], calls: dict, pos: int) -> int:
    """Accepted drafts of the call at pos, read off where the next call starts."""
    later = sorted(p for p in calls if p > pos)
    return min(len(draft), later[0] - pos - 1) if later else len(draft)
