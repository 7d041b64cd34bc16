"""Recording ggspec's drafts and comparing them with llama.cpp's (patch 0009's dump), with forced
acceptance (patch 0005) on both sides; plain greedy output to compare speculative output with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import PROMPTS

from ggspec.bench.forced import ForcedAcceptance, cycle_lengths
from ggspec.bench.native import run_cpp
from ggspec.speculative.driver import generate_greedy, generate_spec
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.request import Request
from ggspec.speculative.sequence import Sequence


class Recorder:
    """Wraps a proposer and keeps every draft it makes: (position of id_last, id_last, tokens)."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.max_draft = inner, inner.name, inner.max_draft
        self.log: list[tuple[int, int, list[int]]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, seqs, n):
        drafts = self.inner.propose(seqs, n)
        self.log += [(seq.pos, seq.id_last, d.tokens.tolist()) for seq, d in zip(seqs, drafts)]
        return drafts


def greedy(eng: Engine, prompt, n: int) -> list[int]:
    """n tokens of the engine's plain greedy decoding of `prompt` (token ids)."""
    return [t for st in generate_greedy(eng, prompt, n, ignore_eos=True) for t in st.tokens]


def ggspec_drafts(eng: Engine, text: str, n_max: int, forced: bool, n: int = 48) -> tuple[list, list[int]]:
    """ggspec's drafts (a Recorder log) for one prompt of n tokens, and the reference (prompt + plain
    greedy) that `forced` acceptance cycled through 0..n_max against; the output must be plain greedy."""
    prompt = eng.target_model.tokenize(text)
    plain = greedy(eng, prompt, n + n_max + 2)
    ref = np.concatenate([prompt, plain]).astype(np.int32)
    rec = Recorder(eng.proposer)
    proposer = ForcedAcceptance(rec, ref, cycle_lengths(n_max), eng.target_model.n_vocab) if forced else rec
    spec = [t for st in generate_spec(eng, prompt, n, ignore_eos=True, proposer=proposer) for t in st.tokens]
    assert spec == plain[:n]
    return rec.log, ref.tolist()


def forced_file(path: Path, ref: list[int], n_max: int) -> Path:
    """A GGSPEC_BENCH_FORCED file for llama.cpp's loop: the same reference and the same cycle of
    accepted counts 0..n_max as `ggspec_drafts(..., forced=True)`."""
    path.write_text(" ".join(map(str, ref)) + "\n" + " ".join(map(str, range(n_max + 1))) + "\n")
    return path


def compare(mine: list, cpp_drafts: list, cpp_anchors: list) -> int:
    """Drafts at every position both loops drafted from agree (llama.cpp's may be shorter: it cuts a
    draft to the -n budget left, ggspec after drafting). Returns the number of common positions."""
    theirs = {pos: (anchor, d) for (pos, d), anchor in zip(cpp_drafts, cpp_anchors)}
    common = 0
    for pos, id_last, tokens in mine:
        if pos not in theirs:
            continue
        anchor, d = theirs[pos]
        assert anchor == id_last, f"position {pos}: id_last {id_last} vs llama.cpp's {anchor}"
        assert tokens[:len(d)] == d, f"position {pos}: ggspec drafted {tokens}, llama.cpp {d}"
        common += 1
    return common


def unforced_drafts_equal_llama_cpps(tool: Path, cfg: PairConfig, text: str, spec_type: str, n: int,
                                     cut_lengths: int = 2) -> tuple:
    """ggspec's drafts with their own acceptance (`cfg`'s n_max, p_min and n_min) equal those of
    llama.cpp's `spec_type` loop on the same files at every common position: full length uncut,
    at least `cut_lengths` lengths and none shorter than n_min where p_min cuts them. Returns
    ggspec's drafts (a Recorder log) and llama.cpp's run."""
    with Engine.open(cfg) as eng:
        mine, _ = ggspec_drafts(eng, text, cfg.n_max, forced=False, n=n)
    res = run_cpp(tool, cfg.target, cfg.draft, text, n, cfg.n_max, defer=False, spec_type=spec_type,
                  p_min=cfg.p_min or None, n_min=cfg.n_min or None, dump_drafts=True)
    assert compare(mine, res.drafts, res.draft_anchors) >= len(mine) - 2
    lengths = {len(d) for _, _, d in mine}
    if cfg.p_min == 0:
        assert lengths == {cfg.n_max}
    else:  # cut drafts of several lengths; with n_min 2, none of length 1
        assert len(lengths) >= cut_lengths and (1 not in lengths) == (cfg.n_min == 2), lengths
    return mine, res


def spec_equals_plain(eng: Engine, texts: list[str], n: int) -> tuple[bool, list]:
    """Whether speculative output equals plain greedy output (n tokens) for every text, and every
    draft made on the way (a Recorder log)."""
    rec = Recorder(eng.proposer)
    same = []
    for text in texts:
        prompt = eng.target_model.tokenize(text)
        plain = [t for st in generate_greedy(eng, prompt, n, ignore_eos=True) for t in st.tokens]
        spec = [t for st in generate_spec(eng, prompt, n, ignore_eos=True, proposer=rec) for t in st.tokens]
        same.append(plain == spec)
    return all(same), rec.log


def assert_drafts_equal(log: list, res, budget_end: int) -> None:
    """ggspec's drafts (a Recorder log) equal llama.cpp's dumped ones (a CppResult) at every common
    position, and have the same length there up to `budget_end`, from where llama.cpp's budget cut
    them; both loops drafted, and llama.cpp's accepted some."""
    theirs = {pos: (anchor, d) for (pos, d), anchor in zip(res.drafts, res.draft_anchors)}
    common = [(pos, idl, d) for pos, idl, d in log if pos in theirs]
    assert len(common) >= len(log) - 2  # all but the budget's last steps
    for pos, id_last, d in common:
        assert (id_last, d[:len(theirs[pos][1])]) == theirs[pos], f"position {pos}"
        assert len(d) == len(theirs[pos][1]) or pos >= budget_end, f"position {pos}"
    assert sum(len(d) for _, _, d in log) > 0 and res.accepted > 0


def drafts_of(eng: Engine, text: str, n: int = 80) -> list:
    """Every draft ggspec makes for one prompt (n tokens): (position, id_last, tokens)."""
    rec = Recorder(eng.proposer)
    list(generate_spec(eng, eng.target_model.tokenize(text), n, ignore_eos=True, proposer=rec))
    return rec.log


def three_at_once_equal_plain(eng: Engine, n: int) -> list:
    """Decode PROMPTS[:3] together; each sequence's tokens must be its plain greedy output."""
    prompts = [eng.target_model.tokenize(p) for p in PROMPTS[:3]]
    plain = [greedy(eng, p, n) for p in prompts]
    eng.reset()
    seqs = [eng.add(Request(p, n, ignore_eos=True)) for p in prompts]
    list(eng.run())
    assert [s.tokens for s in seqs] == plain
    return seqs


def sequence(prompt, tokens, include_id_last: bool = True, seq_id: int = 0) -> Sequence:
    """A sequence as a proposer sees it after `tokens` were generated from `prompt` (its history
    with or without id_last, the last token, appended)."""
    s = Sequence(seq_id, Request(prompt, 1000))
    s.tokens = list(tokens)
    s.history = list(prompt) + list(tokens if include_id_last else tokens[:-1])
    s.id_last = tokens[-1] if tokens else -1
    return s
