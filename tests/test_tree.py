"""Token trees (speculative.tree): DDTree from per-position distributions, its greedy walk, and what
a tree would accept per target call on the trained tiny pair's DFlash draft (bench.trees)."""

from __future__ import annotations

import numpy as np
import pytest

from ggspec.speculative.request import Request
from ggspec.speculative.tree import Tree, chain, ddtree, top_k


def _candidates(probs: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-position candidates with token ids 10 * position + rank, best first."""
    p = np.asarray(probs, dtype=np.float64)
    tokens = np.asarray([[10 * d + j for j in range(p.shape[1])] for d in range(p.shape[0])], dtype=np.int32)
    return tokens, np.log(p)


def test_the_chain_comes_first_then_the_best_paths():
    tokens, lp = _candidates([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.9, 0.05, 0.05]])
    tree = ddtree(tokens, lp, budget=5)
    assert tree.n_chain == 3 and tree.tokens[:3].tolist() == [0, 10, 20]  # the top-1 chain
    assert tree.parents[:3].tolist() == [-1, 0, 1] and tree.depths[:3].tolist() == [1, 2, 3]
    # then by joint probability: 0.6 * 0.4 = 0.24 (node 0's second child), 0.3 (the root's second)
    joint = {tree.path(i)[-1]: np.exp(sum(lp[d, t % 10] for d, t in enumerate(tree.path(i)))) for i in range(5)}
    assert tree.tokens[3:].tolist() == [1, 11] and tree.parents[3:].tolist() == [-1, 0]
    assert joint[1] == pytest.approx(0.3) and joint[11] == pytest.approx(0.24)
    bigger = ddtree(tokens, lp, budget=64)
    assert len(bigger) == 3 + 9 + 27  # every path of the 3 x 3 x 3 lattice
    assert len({tuple(bigger.path(i)) for i in range(len(bigger))}) == len(bigger)  # no node twice


def test_a_budget_below_the_chain_cuts_the_chain():
    tokens, lp = _candidates([[0.6, 0.4], [0.7, 0.3], [0.8, 0.2]])
    tree = ddtree(tokens, lp, budget=2)
    assert tree.tokens.tolist() == [0, 10] and tree.n_chain == 2
    assert len(ddtree(tokens, lp, budget=0)) == 0


def test_greedy_acceptance_is_the_longest_held_prefix():
    tokens, lp = _candidates([[0.6, 0.4], [0.7, 0.3], [0.8, 0.2]])
    tree = ddtree(tokens, lp, budget=14)
    assert tree.accepted([0, 10, 20]) == 3  # the chain
    assert tree.accepted([1, 11, 21]) == 3  # a branch off the chain at the root
    assert tree.accepted([0, 11, 99]) == 2
    assert tree.accepted([99]) == 0
    assert chain([5, 6, 7]).accepted([5, 6, 8]) == 2
    assert isinstance(chain([5]), Tree)


def test_top_k_is_log_softmax_best_first():
    logits = np.array([[1.0, 3.0, 2.0, -1.0]])
    cols, lp = top_k(logits, 2)
    assert cols.tolist() == [[1, 2]]
    z = np.log(np.exp(logits).sum())
    assert lp[0].tolist() == pytest.approx([3.0 - z, 2.0 - z])


def test_trees_accept_more_per_target_call_than_the_chain(build_info):
    """The trained tiny pair's DFlash draft, greedy: an engine made to commit a DDTree's accepted
    path decodes the plain greedy text, and its trees hold at least what the chain would have
    accepted at every step (the chain is in every tree), more once the budget passes the chain."""
    from helpers.pairs import DFLASH, STACK, TARGET

    from ggspec.bench.trees import TreeCommit
    from ggspec.runtime import ContextParams
    from ggspec.speculative.driver import decode_one
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.models import Models, PairConfig

    cfg = PairConfig(TARGET, DFLASH, n_max=7, calibrate=False, ctx=ContextParams(n_ctx=2048, n_threads=1))
    n = 64
    with Models(cfg) as models:
        with Engine(models, cfg, plain=True) as plain:
            ids = plain.target_model.tokenize(STACK)
            reference = [*ids.tolist(), *decode_one(plain, ids, n + 8, speculate=False, ignore_eos=True).tokens]
        per_budget = {}
        for budget in (7, 32):
            with Engine(models, cfg, wrap_proposer=lambda p, b=budget: TreeCommit(p, b, 8, models.target.n_vocab)) as e:
                e.proposer.reference = lambda _seq: reference
                seq = decode_one(e, ids, n, ignore_eos=True)
                assert seq.tokens == reference[len(ids):len(ids) + n]
                c = e.proposer.counts
                assert c.steps and c.accepted >= c.chain_accepted
                per_budget[budget] = (c.accepted / c.steps, c.chain_accepted / c.steps, c.nodes / c.steps)
    assert per_budget[7][0] == per_budget[7][1]  # a budget of the chain's length is the chain
    assert per_budget[32][0] > per_budget[32][1] and per_budget[32][2] > 7


def test_branch_sequences_tag_each_row_with_the_branches_through_it():
    from ggspec.speculative.tree import branch_sequences

    tokens, lp = _candidates([[0.6, 0.4], [0.7, 0.3]])
    tree = ddtree(tokens, lp, budget=4)  # the chain 0 -> 10, then 1 (0.4) and its child 10 (0.28)
    assert [tree.path(i) for i in range(4)] == [[0], [0, 10], [1], [1, 10]]
    rows, n = branch_sequences(tree, first=1)
    leaves = [i for i in range(len(tree)) if i not in tree.parents.tolist()]
    assert n == len(leaves) == 2
    assert sorted(rows[0]) == [1, 2]  # the root is on every branch
    for i in range(len(tree)):
        below = {k for k, leaf in enumerate(leaves) if i in _ancestors(tree, leaf)}
        assert {s - 1 for s in rows[i + 1]} == below


def _ancestors(tree: Tree, node: int) -> set[int]:
    out = set()
    while node >= 0:
        out.add(node)
        node = int(tree.parents[node])
    return out


def test_one_decode_verifies_a_whole_tree_with_llama_cpps_sequences(build_info):
    """The mechanism the tree verify is to use, unpatched: each leaf's branch a sequence of its own,
    the prefix's cells shared into each (seq_cp on a unified cache), every node's row tagged with
    the branches through it. Every node's logits are those of a chain decode of its own path."""
    from helpers.pairs import STACK, TARGET

    from ggspec.runtime import Batch, Context, ContextParams, Model
    from ggspec.speculative.tree import branch_sequences

    with Model(TARGET) as model:
        ids = model.tokenize(STACK).tolist()
        ref = Context(model, ContextParams(n_ctx=1024, n_threads=1))
        batch = Batch(ref)
        ref.decode(batch.add_tokens(ids, 0, outputs="all"))
        cols, lp = top_k(ref.logits()[-6:], 3)
        tree = ddtree(cols, lp, budget=24)
        rows, n_branches = branch_sequences(tree, first=1)
        pos = len(ids) - 1
        ctx = Context(model, ContextParams(n_ctx=1024, n_threads=1, n_seq_max=1 + n_branches, kv_unified=True))
        verify = Batch(ctx)
        ctx.decode(verify.add_tokens(ids[:-1], 0, outputs="none"))
        mem = model.lc.llama_get_memory(ctx.ptr)
        for s in range(1, 1 + n_branches):
            model.lc.llama_memory_seq_cp(mem, 0, s, 0, pos)
        verify.clear().add_shared(ids[-1], pos, rows[0])
        for i in range(len(tree)):
            verify.add_shared(int(tree.tokens[i]), pos + int(tree.depths[i]), rows[i + 1])
        ctx.decode(verify)
        got = ctx.logits()
        assert got[0].argmax() == ref.logits()[-1].argmax()
        for i in range(len(tree)):
            ref.remove(len(ids))
            ref.decode(batch.clear().add_tokens(tree.path(i), len(ids), outputs="last"))
            want = ref.logits()[-1]
            assert want.argmax() == got[i + 1].argmax(), i
            np.testing.assert_allclose(got[i + 1], want, atol=2e-2)
        for obj in (verify, ctx, batch, ref):
            obj.close()


def test_a_tree_verified_then_its_accepted_path_committed(build_info):
    """A whole greedy tree step with llama.cpp's sequences: the tree (grown so that the target's
    continuation leaves the top-1 chain at depth 2) is verified in one decode, walked greedily, its
    accepted path's cells given to the sequence (Context.share_cells) and every branch dropped.
    The sequence then holds exactly prompt + path, and its next decode is the chain's."""
    from helpers.pairs import STACK, TARGET

    from ggspec.runtime import Batch, Context, ContextParams, Model
    from ggspec.speculative.tree import branch_sequences

    with Model(TARGET) as model:
        ids = model.tokenize(STACK).tolist()
        ref = Context(model, ContextParams(n_ctx=1024, n_threads=1))
        batch = Batch(ref)
        ref.decode(batch.add_tokens(ids, 0, outputs="last"))
        greedy = []
        for _ in range(7):  # the plain greedy continuation, a chain decode per token
            greedy.append(int(ref.logits()[-1].argmax()))
            ref.decode(batch.clear().add_tokens(greedy[-1:], len(ids) + len(greedy) - 1, outputs="last"))
        others = [t for t in range(10, 40) if t not in greedy]
        cand = np.array([[others[2 * d], greedy[d], others[2 * d + 1]] if d == 1 else
                         [greedy[d], others[2 * d], others[2 * d + 1]] for d in range(6)], dtype=np.int32)
        tree = ddtree(cand, np.log(np.tile([0.5, 0.3, 0.2], (6, 1))), budget=40)
        assert tree.accepted(greedy) >= 2 and tree.accepted(greedy) > chain(cand[:, 0]).accepted(greedy)

        rows, n_branches = branch_sequences(tree, first=1)
        pos = len(ids) - 1
        ctx = Context(model, ContextParams(n_ctx=1024, n_threads=1, n_seq_max=1 + n_branches, kv_unified=True))
        verify = Batch(ctx)
        ctx.decode(verify.add_tokens(ids[:-1], 0, outputs="none"))
        for s in range(1, 1 + n_branches):
            ctx.share_cells(0, s, 0, pos)
        verify.clear().add_shared(ids[-1], pos, [*rows[0], 0])  # the root is the sequence's own
        for i in range(len(tree)):
            verify.add_shared(int(tree.tokens[i]), pos + int(tree.depths[i]), rows[i + 1])
        ctx.decode(verify)
        logits = ctx.logits()
        # the greedy walk over the verified rows
        node, path = -1, []
        best = int(logits[0].argmax())
        while True:
            child = next((i for i in range(len(tree)) if tree.parents[i] == node and tree.tokens[i] == best), None)
            if child is None:
                break
            node, path = child, [*path, child]
            best = int(logits[child + 1].argmax())
        assert [int(tree.tokens[i]) for i in path] == greedy[:len(path)] and best == greedy[len(path)]
        depth = len(path)
        if depth:
            ctx.share_cells(rows[path[-1] + 1][0], 0, pos + 1, pos + 1 + depth)
        for s in range(1, 1 + n_branches):
            ctx.drop_sequence(s)
        assert ctx.pos_max(0) == pos + depth
        # the next decode on the committed sequence is the chain's
        ctx.decode(verify.clear().add_tokens([best], pos + depth + 1, outputs="last"))
        got = ctx.logits()[-1]
        assert int(got.argmax()) == greedy[depth + 1]
        ref.remove(len(ids) + depth)  # (the reference holds the continuation: the same token again)
        ref.decode(batch.clear().add_tokens([best], len(ids) + depth, outputs="last"))
        np.testing.assert_allclose(got, ref.logits()[-1], atol=2e-2)
        for obj in (verify, ctx, batch, ref):
            obj.close()


# --- the engine's tree verify ------------------------------------------------------------------------

def _tiny_cfg(budget: int | None, auto: bool = False, kind: str = "draft-dflash", **kw):
    from helpers.pairs import DFLASH, DRAFT, EAGLE3, TARGET

    from ggspec.runtime import ContextParams
    from ggspec.speculative.models import PairConfig

    draft = {"draft-dflash": DFLASH, "draft-simple": DRAFT, "draft-eagle3": EAGLE3}.get(kind, DFLASH)
    return PairConfig(TARGET, draft, spec_type=kw.pop("spec_type", kind), n_max=7, calibrate=False,
                      tree_budget=budget, tree_auto=auto, ctx=ContextParams(n_ctx=2048, n_threads=1), **kw)


@pytest.mark.parametrize("kind", ["draft-dflash", "draft-simple", "draft-eagle3"])
def test_the_engine_verifies_trees_as_the_simulation_says(kind, build_info):
    """The engine verifying real trees (one decode, branches, the accepted path's cells kept, the
    drafter fed the path: DFlash and EAGLE3 its feature rows, draft-simple its tokens) decodes the
    plain greedy text, and accepts at every step exactly what TreeCommit's simulation of the same
    budget accepts: the drafter's state after a tree step is what a chain that committed the same
    tokens leaves, or its next trees would differ."""
    from helpers.pairs import STACK

    from ggspec.bench.trees import TreeCommit
    from ggspec.speculative.driver import decode_one
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.models import Models

    n = 96
    chain_cfg = _tiny_cfg(0, kind=kind)
    with Models(chain_cfg) as models:
        with Engine(models, chain_cfg, plain=True) as plain:
            ids = plain.target_model.tokenize(STACK)
            reference = [*ids.tolist(), *decode_one(plain, ids, n + 8, speculate=False, ignore_eos=True).tokens]
        with Engine(models, chain_cfg) as chain_engine:
            chain_seq = decode_one(chain_engine, ids, n, ignore_eos=True)
        for budget in (16, 32):
            wrap = lambda p, b=budget: TreeCommit(p, b, 8, models.target.n_vocab)  # noqa: E731
            with Engine(models, chain_cfg, wrap_proposer=wrap) as e:
                e.proposer.reference = lambda _seq: reference
                decode_one(e, ids, n, ignore_eos=True)
                simulated = e.proposer.counts.depths
            with Engine(models, _tiny_cfg(budget, kind=kind)) as e:
                assert e.target.kv_unified and e.tree_rule is not None and e.tree_rule.budget == budget
                seq = decode_one(e, ids, n, ignore_eos=True)
                assert seq.tokens == reference[len(ids):len(ids) + n]
            st = seq.stats
            assert st.tree_steps > 0 and st.nodes > st.drafted
            assert st.tau > chain_seq.stats.tau  # more per target call than the chain
            got = _accepted_per_step(models, _tiny_cfg(budget, kind=kind), ids, n)
            # (the last step is cut by the token budget in the engine, not in the simulation)
            assert len(got) == len(simulated) and got[:-1] == simulated[:-1]


def _accepted_per_step(models, cfg, ids, n: int) -> list[int]:
    from ggspec.speculative.engine import Engine

    with Engine(models, cfg) as e:
        e.add(Request(ids, n, ignore_eos=True))
        return [step.accepted for _, step in e.run() if step.kind == "spec"]


def test_trees_of_several_sequences_in_one_verify(build_info):
    """Two sequences with trees in one verify decode (a unified cache, each slot's branch ids of its
    own), a third joining later: each decodes its own plain greedy text."""
    from conftest import PROMPTS
    from helpers.pairs import STACK

    from ggspec.speculative.driver import decode_one
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.models import Models

    cfg = _tiny_cfg(24, parallel=2)
    n = 48
    with Models(cfg) as models:
        prompts = [models.target.tokenize(p) for p in (STACK, *PROMPTS[:2])]
        with Engine(models, cfg, plain=True) as plain:
            want = [decode_one(plain, ids, n, speculate=False, ignore_eos=True).tokens for ids in prompts]
        with Engine(models, cfg) as e:
            assert e.capacity == e.target.n_ctx // 2
            seqs = [e.add(Request(ids, n, ignore_eos=True)) for ids in prompts[:2]]
            trees = 0
            while e.active:
                for _, step in e.step():
                    trees += step.nodes > step.drafted
                if e.can_add(prompts[2], n) and len(seqs) == 2:
                    seqs.append(e.add(Request(prompts[2], n, ignore_eos=True)))
            assert [s.tokens for s in seqs] == want
            assert trees > 0
            assert all(e.target.pos_max(b) == -1 for b in range(2, 2 + 2 * 24))  # every branch dropped


def test_trees_are_refused_where_they_cannot_run(build_info, hybrid_pair, dense_pair):
    """A fixed budget that cannot run is refused in one line, naming what stops it; `auto` then
    verifies chains."""
    from ggspec.errors import InputError
    from ggspec.native.bindings import batch_invariant, set_batch_invariant
    from ggspec.runtime import ContextParams
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.models import PairConfig

    ctx = ContextParams(n_ctx=1024, n_threads=1)
    hybrid = PairConfig(hybrid_pair.target, hybrid_pair.draft, fixed_block=True, n_max=7, calibrate=False, ctx=ctx)
    cases = [
        (PairConfig(**{**hybrid.__dict__, "tree_budget": 16, "tree_auto": False}), "recurrent"),
        (_tiny_cfg(16, spec_type="ngram-simple"), "ngram-simple drafts do not give"),
        (_tiny_cfg(64, parallel=4), "256"),
        (_tiny_cfg(16, inject="immediate"), "pruned"),
    ]
    for cfg, why in cases:
        with pytest.raises(InputError, match=why):
            Engine.open(cfg).close()
    with Engine.open(PairConfig(**{**hybrid.__dict__, "tree_budget": None, "tree_auto": True})) as e:
        assert e.tree_rule is None and not e.target.kv_unified
    with Engine.open(_tiny_cfg(None, auto=True, parallel=2)) as e:
        assert e.tree_rule is None  # auto: several sequences keep their own caches
    with Engine.open(PairConfig(dense_pair.target, dense_pair.draft, fixed_block=True, n_max=7, calibrate=False,
                                ctx=ctx)) as e:
        assert e.tree_rule is None  # auto: chains where outputs are byte-exact (the CPU, batch-invariant)
    invariant = batch_invariant()
    try:
        set_batch_invariant(False)
        with Engine.open(PairConfig(dense_pair.target, dense_pair.draft, fixed_block=True, n_max=7, calibrate=False,
                                    ctx=ctx)) as e:
            assert e.tree_rule is not None and e.tree_rule.auto and e.tree_rule.budget == 0
    finally:
        set_batch_invariant(invariant > 0, invariant or None)


def test_auto_chooses_trees_where_rows_are_cheap_and_chains_where_they_are_dear():
    """The budget rule on given costs and the tiny pair's measured tree acceptance (tokens per call:
    chain 3.74, budgets 8 / 16 / 32 / 64: 4.02 / 4.47 / 4.68 / 4.92): verify rows nearly free (a
    GPU) -> a large tree; the row costs measured on this CPU (8 rows 1.69x a decode, 9 rows 2.07x,
    33 rows 5.72x, 65 rows 10.81x) -> the chain, and no tree is grown even to score it: none
    could pay even at GAIN_MAX."""
    from ggspec.speculative.rules.costs import ShapeCosts
    from ggspec.speculative.rules.tree_budget import REPLAN, TreeBudget

    accepted = {0: 2.74, 8: 3.02, 16: 3.47, 32: 3.68, 64: 3.92}
    decode = 0.004

    def rule(times: dict[int, float]) -> TreeBudget:
        costs = ShapeCosts()
        for rows, x in times.items():
            costs.add(rows, decode * x)
        r = TreeBudget(7, 64, True, costs)
        r.other = 0.002  # the draft call and the rest of a step
        r.stats.accepted.update(accepted)
        r._since = REPLAN
        return r

    gpu = rule({1: 1.0, 8: 1.02, 9: 1.02, 17: 1.04, 33: 1.08, 65: 1.3})
    assert gpu.choose(1, 1) == 32  # 64 adds too little for its rows
    assert gpu.budgets == [16, 32, 64] and not gpu.hopeless(1)
    cpu = rule({1: 1.0, 8: 1.69, 9: 2.07, 17: 3.3, 33: 5.72, 65: 10.81})
    assert cpu.choose(1, 1) == 0 and cpu.hopeless(1)
    assert rule({1: 1.0, 8: 8.0, 33: 33.0}).hopeless(1)  # rows in proportion


class _TruthAmongCandidates:
    """A test drafter (wraps one that grows trees): its own drafts, but at every drafted position the
    target's true next token joins the candidates as the second best (unless it is the best), so
    the tree holds the target's continuation on a path off the chain: every step then commits an
    off-chain path, and `drafts` records the drafter's own chains step by step."""

    def __init__(self, inner, reference) -> None:
        self.inner, self.reference = inner, reference
        self.name, self.max_draft, self.grows_trees = inner.name, inner.max_draft, True
        self.drafts: list[list[int]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, seqs, n):
        made = self.inner.propose(seqs, n)
        self.drafts += [d.tokens.tolist() for d in made]
        return made

    def marginals(self, seqs, n, k):
        out = []
        for seq, cand in zip(seqs, self.inner.marginals(seqs, n, k)):
            if cand is None:
                out.append(None)
                continue
            tokens, logprobs = cand[0].copy(), cand[1].copy()
            truth = self.reference[seq.pos + 1:seq.pos + 1 + n]
            for d, t in enumerate(truth):
                if tokens[d, 0] != t:
                    tokens[d, 1], logprobs[d, 1] = t, logprobs[d, 0] - 0.01
            out.append((tokens, logprobs))
        return out


def test_an_mtp_drafter_follows_a_trees_off_chain_paths(fixture_dir, build_info):
    """The Gemma 4 assistant (an MTP drafter on a dense target, reading the target's cells) with the
    target's continuation planted among its candidates: every tree step commits a path off the
    chain, and the drafter's chains after each step equal those of the chain engine made to commit
    the same paths (TreeCommit): the accepted path's cells are the sequence's. (This random-weight
    drafter's drafts do not depend on the carried h, so the h of the path's last row is not
    what this checks.)"""
    from helpers.fixtures.gemma4 import ensure_gemma4_pair

    from ggspec.bench.trees import TreeCommit
    from ggspec.runtime import ContextParams
    from ggspec.speculative.driver import decode_one
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.models import Models, PairConfig

    pair = ensure_gemma4_pair(fixture_dir)
    ctx, n = ContextParams(n_ctx=1024, n_threads=1), 40

    def cfg(budget):
        return PairConfig(target=pair.target, draft=pair.drafter, ctx=ctx, n_max=3, calibrate=False,
                          tree_budget=budget, tree_auto=False)

    with Models(cfg(0)) as models:
        with Engine(models, cfg(0), plain=True) as plain:
            ids = plain.target_model.tokenize("def fibonacci(n):\n    if n < 2:")
            reference = [*ids.tolist(), *decode_one(plain, ids, n + 8, speculate=False, ignore_eos=True).tokens]
        planted = {}

        def simulated(p):
            planted["sim"] = _TruthAmongCandidates(p, reference)
            return TreeCommit(planted["sim"], 16, 8, models.target.n_vocab)

        with Engine(models, cfg(0), wrap_proposer=simulated) as e:
            e.proposer.reference = lambda _seq: reference
            decode_one(e, ids, n, ignore_eos=True)
            depths = e.proposer.counts.depths

        def real(p):
            planted["real"] = _TruthAmongCandidates(p, reference)
            return planted["real"]

        with Engine(models, cfg(16), wrap_proposer=real) as e:
            seq = decode_one(e, ids, n, ignore_eos=True)
            assert seq.tokens == reference[len(ids):len(ids) + n]
            assert seq.stats.tree_steps > 0 and seq.stats.accepted > 0
    assert sum(depths) > 0
    assert planted["real"].drafts == planted["sim"].drafts[:len(planted["real"].drafts)]


def test_a_tree_beside_a_sequence_that_verifies_chains(build_info):
    """Two sequences drafting in one DFlash call, the first asking for token probabilities (it
    verifies chains): the second's tree is grown from its own block (found by sequence, not by its
    place among those that grow trees), verified, and both texts are plain greedy's."""
    from conftest import PROMPTS
    from helpers.pairs import STACK

    from ggspec.speculative.driver import decode_one
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.models import Models

    cfg = _tiny_cfg(16, parallel=2)
    n = 48
    with Models(cfg) as models:
        prompts = [models.target.tokenize(p) for p in (PROMPTS[0], STACK)]
        with Engine(models, cfg, plain=True) as plain:
            want = [decode_one(plain, ids, n, speculate=False, ignore_eos=True).tokens for ids in prompts]
        with Engine(models, cfg) as e:
            chain = e.add(Request(prompts[0], n, ignore_eos=True, n_probs=1))
            tree = e.add(Request(prompts[1], n, ignore_eos=True))
            list(e.run())
        assert [chain.tokens, tree.tokens] == want
        assert chain.stats.tree_steps == 0 and tree.stats.tree_steps >= tree.stats.spec_steps - 1  # (the last: cut)


def test_the_tree_budget_flag_rejects_nonsense_in_one_line(hybrid_pair):
    """`--spec-tree-budget` values that mean nothing, and a fixed budget where trees cannot run: one
    line naming the flag, a non-zero exit, no traceback."""
    from conftest import run_cli
    from helpers.pairs import DFLASH, TARGET

    pair = ["-m", str(TARGET), "-md", str(DFLASH), "-p", "x", "-n", "4", "-t", "1"]
    hybrid = ["-m", str(hybrid_pair.target), "-md", str(hybrid_pair.draft), "-p", "x", "-n", "4", "-t", "1"]
    for args, says in ((pair + ["--spec-tree-budget", "many"], "--spec-tree-budget: many: expected"),
                       (pair + ["--spec-tree-budget", "300"], "--spec-tree-budget: the tree budget must be"),
                       (pair + ["--spec-tree-budget", "auto:-1"], "--spec-tree-budget: the tree budget must be"),
                       (hybrid + ["--spec-tree-budget", "16"], "--spec-tree-budget: token trees")):
        proc = run_cli("run", *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and len(lines) == 1 and says in lines[0], (args, proc.stderr)
        assert "Traceback" not in proc.stderr
