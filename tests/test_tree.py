"""Token trees (speculative.tree): DDTree from per-position distributions, its greedy walk, and what
a tree would accept per target call on the trained tiny pair's DFlash draft (bench.trees)."""

from __future__ import annotations

import numpy as np
import pytest

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
    from ggspec.bench.trees import TreeCommit
    from ggspec.runtime import ContextParams
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.loop import decode_one
    from ggspec.speculative.models import Models, PairConfig
    from helpers.pairs import DFLASH, STACK, TARGET

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
