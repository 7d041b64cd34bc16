"""`ggspec run`'s last line, and `--check`: speculation measured against plain decoding.

The verdict times the (single) prompt again on the same engine, plain and speculative in turn,
and says whether speculation paid, with what to try when it lost. The decode the user saw went
first, cold (graphs built, caches touched); the runs timed after it alternate, plain first, so
both kinds are warm and drift hits both alike: the verdict is the median of their paired ratios,
with their range (how sure it is). `--check`
decodes every prompt plain greedy and says, per prompt, whether the outputs are identical and, where
not, whether the difference is a benign near-tie or a REAL divergence (ggspec.speculative.lossless).
"""

from __future__ import annotations

import time
from statistics import median

from ggspec.cli.console import err

COMPARE_MAX_S = 5.0  # `run` times a speculative decode this short against plain decoding, to say whether it paid
BREAK_EVEN = 0.05  # closer to 1× than this is no difference worth a verdict
PAIRS = 5  # plain + speculative pairs timed at most
# ... while they have taken less than this many times the decode the user saw, or a second (one pair at least)
PAIRS_BUDGET, PAIRS_MIN_S = 2.0, 1.0


def verdict(sp, tokens: list[list[int]], seqs: list, n_predict: int, ignore_eos: bool, compare: bool | None,
            bench_args: str, checked: bool, grammar: str | None = None) -> str:
    """The run's last line: the speedup against plain decoding of the same prompt on the same
    engine, timed right after in alternating warm runs (module docstring), with what to try when
    speculation lost; or, for a long decode or several prompts, how to measure it. At temperature 0
    it also says whether the two outputs are identical (--check, when given, says it in its own lines).
    Every decode runs under the output's `grammar` (GBNF; None: free)."""
    bench = bench_command(bench_args)
    if len(seqs) != 1:
        batched = bench_command(bench_args, f"-np {sp.parallel}" if sp.parallel > 1 else "")
        return f"speedup vs plain decoding: not measured for several prompts; {batched} measures it"
    seq, s = seqs[0], seqs[0].stats
    if compare is None and s.t_decode > COMPARE_MAX_S:
        return (f"speedup vs plain decoding: not measured (the decode took {s.t_decode:.0f} s; --compare measures "
                f"it); {bench} measures it side by side with llama.cpp")
    if sp.plain_by_cost:  # nothing to compare: the engine decoded plainly
        return (f"speculation broke even: no draft length pays on this machine for this pair (measured costs), so "
                f"it decoded plainly ({s.decode_tps:.1f} t/s); {bench} compares fixed lengths side by side")
    greedy = sp.sampling.greedy
    # sampled: plain decoding draws other tokens, so each run decodes as many as speculation committed
    n, all_tokens = (n_predict, ignore_eos) if greedy else (s.n_generated, True)
    budget = max(PAIRS_MIN_S, PAIRS_BUDGET * s.t_decode)
    spec_tps, plain_tps, plain_tokens = timed_pairs(sp, tokens[0], n, all_tokens, budget, grammar)
    if not plain_tps or min(spec_tps + plain_tps) <= 0:
        return "speedup vs plain decoding: not measured (too few tokens decoded after the prompt)"
    if not s.spec_steps:  # (say, n-gram drafts that never found a match)
        return (f"speculation never verified a draft in this text: {median(spec_tps):.1f} t/s against "
                f"{median(plain_tps):.1f} t/s plain ({runs_words(len(plain_tps))})")
    ratios = sorted(a / b for a, b in zip(spec_tps, plain_tps))
    ratio = median(ratios)
    speeds = f"{ratio:.2f}× plain decoding ({median(spec_tps):.1f} vs {median(plain_tps):.1f} t/s, {runs_words(len(ratios))}"
    if len(ratios) > 1:
        speeds += f", paired ratios {ratios[0]:.2f}-{ratios[-1]:.2f}×"
    if greedy and not checked:
        speeds += "; output " + same_as_plain(sp, tokens[0], seq.tokens, plain_tokens, n_predict, ignore_eos, grammar)
    speeds += ")"
    if ratio >= 1 + BREAK_EVEN:
        return f"speculation paid: {speeds}"
    if ratio > 1 - BREAK_EVEN:
        return f"speculation broke even: {speeds}; {bench} measures it with repetitions"
    return f"speculation lost on this machine: {speeds}; try {what_to_try(sp)}, or measure with {bench}"


def timed_pairs(sp, prompt: list[int], n: int, ignore_eos: bool, budget: float,
                grammar: str | None = None) -> tuple[list, list, list[int]]:
    """Plain then speculative decodes of `prompt`, in turn, PAIRS pairs or as many as `budget`
    seconds allow (one at least): their decode speeds, and the first plain run's tokens."""
    from ggspec.speculative.driver import decode_one

    spec_tps, plain_tps, plain_tokens = [], [], None
    t0 = time.perf_counter()
    while len(plain_tps) < PAIRS and (not plain_tps or time.perf_counter() - t0 < budget):
        plain = decode_one(sp, prompt, n, speculate=False, ignore_eos=ignore_eos, grammar=grammar)
        spec = decode_one(sp, prompt, n, ignore_eos=ignore_eos, grammar=grammar)
        plain_tokens = plain.tokens if plain_tokens is None else plain_tokens
        plain_tps.append(plain.stats.decode_tps)
        spec_tps.append(spec.stats.decode_tps)
    return spec_tps, plain_tps, plain_tokens


def runs_words(n: int) -> str:
    """How the speeds were measured, for the verdict line."""
    return "one warm run each" if n == 1 else f"median of {n} alternating warm runs each"


def bench_command(*args: str) -> str:
    """`ggspec bench` with these arguments (empty ones left out), as the verdict line names it."""
    return "`" + " ".join(["ggspec bench", *(a for a in args if a)]) + "`"


def same_as_plain(sp, prompt: list[int], spec: list[int], plain: list[int], n_predict: int, ignore_eos: bool,
                  grammar: str | None = None) -> str:
    """'identical to plain greedy', or which kind of difference it is (decided by plain_divergence:
    the timed plain decode kept no margins)."""
    div = None if spec == plain else plain_divergence(sp, prompt, spec, n_predict, ignore_eos, grammar)[1]
    return "identical to plain greedy" if div is None else div.describe()


def plain_divergence(sp, prompt: list[int], spec: list[int], n_predict: int, ignore_eos: bool,
                     grammar: str | None = None):
    """Decode `prompt` plain greedy with the target's top-2 margins recorded and compare it with the
    speculative output: (the plain tokens, the first difference or None; a near-tie is benign)."""
    from ggspec.speculative.driver import generate_greedy
    from ggspec.speculative.lossless import byte_exact, compare, engine_models

    steps = list(generate_greedy(sp, prompt, n_predict, record_margins=True, ignore_eos=ignore_eos, grammar=grammar))
    plain = [t for st in steps for t in st.tokens]
    return plain, compare(plain, [m for st in steps for m in st.margins], spec, byte_exact(engine_models(sp)))


def what_to_try(sp) -> str:
    """Settings that may win where this one lost, in flags, leaving out the one in use."""
    tries = []
    from_text = any(t.traits.cheap for t in sp.plan.types)  # an n-gram type among them already
    if sp.draft_length is None:
        if sp.n_max > 3 and not from_text:
            tries.append("a shorter draft (--spec-draft-n-max 3)")
        tries.append("--spec-draft-n-max auto (chooses the length, none included, every step)")
    if not from_text:
        tries.append("--spec-type ngram-simple (drafts from the text itself: no draft model to run)")
    tries.append("--no-spec")
    return ", ".join(tries[:-1]) + " or " + tries[-1] if len(tries) > 1 else tries[0]


def check_lossless(sp, prompts: list[list[int]], outputs: dict[int, list[int]], n_predict: int,
                   ignore_eos: bool, grammar: str | None = None) -> bool:
    """--check: each prompt decoded plain greedy by a plain engine on the same models, configured as
    `--no-spec` configures it (so the comparison is with what `--no-spec` prints, not with the
    speculative engine's own contexts), compared token for token with the speculative output; one
    line per prompt saying which kind any difference is, and by which rule. Whether one was a REAL
    divergence."""
    from dataclasses import replace

    from ggspec.speculative.engine import Engine
    from ggspec.speculative.lossless import GATE_RULE, IDENTITY_RULE, byte_exact, engine_models

    rule = IDENTITY_RULE if byte_exact(engine_models(sp)) else GATE_RULE
    counts = {"identical": 0, "near-tie": 0, "REAL": 0}
    plain_cfg = replace(sp.cfg, draft=None, use_draft=False, spec_type=None, spec_options={})  # as --no-spec makes it
    with Engine(sp.models, plain_cfg, plain=True) as plain_engine:
        for i, prompt in enumerate(prompts):
            plain, div = plain_divergence(plain_engine, prompt, outputs[i], n_predict, ignore_eos, grammar)
            which = f"prompt {i + 1}: " if len(prompts) > 1 else ""
            if div is None:
                counts["identical"] += 1
                err.print(f"check: {which}identical to plain greedy (--no-spec), {len(plain)} tokens ({rule})",
                          soft_wrap=True)
            else:
                counts["near-tie" if div.benign else "REAL"] += 1
                err.print(f"check: {which}{div.describe()}", soft_wrap=True)
    if len(prompts) > 1:
        err.print(f"check: {counts['identical']}/{len(prompts)} identical, {counts['near-tie']} benign near-ties, "
                  f"{counts['REAL']} REAL divergences ({rule})", soft_wrap=True)
    return counts["REAL"] > 0
