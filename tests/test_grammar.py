"""Grammar-constrained output under speculation (runtime.Grammar: llama.cpp's grammar sampler), on
the real build: greedy speculative output under a grammar equals plain greedy output under the
same grammar, for every batch position and with drafts the grammar cuts; sampled output keeps the
distribution the grammar leaves; the text follows the grammar."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
from helpers.pairs import CPP_CTX, DRAFT, STACK, TARGET
from scipy.stats import chisquare

from ggspec.errors import InputError
from ggspec.runtime.grammar import Grammar
from ggspec.speculative.driver import drive
from ggspec.speculative.engine import Engine
from ggspec.speculative.models import PairConfig
from ggspec.speculative.request import Request
from ggspec.speculative.sampling import SamplerSettings

# a Python-ish line: a name, "(", names separated by ", ", "):" and the end of the text
GBNF = r'''root ::= "    def " name "(" name ("," " " name)* "):" "\n"
name ::= [a-z_] [a-z_0-9]{0,11}'''
LINE = re.compile(r"    def [a-z_][a-z_0-9]{0,11}\([a-z_][a-z_0-9]{0,11}(, [a-z_][a-z_0-9]{0,11})*\):\n")
N = 40


def _decode(engine: Engine, prompts: list, grammar: str | None, **kw) -> list[list[int]]:
    out: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    requests = [Request(p, N, tag=i, grammar=grammar, **kw) for i, p in enumerate(prompts)]
    for ev in drive(engine, requests):
        out[ev.tag] += ev.tokens
    return [out[i] for i in range(len(prompts))]


def test_greedy_speculation_under_a_grammar_equals_plain():
    """Draft-simple at n_max 6, three sequences batched: token for token the plain greedy text
    under the grammar, which follows the grammar (and ends with an end-of-generation token where
    the grammar is complete)."""
    prompts = [STACK, STACK + "        return self.items.pop()\n\n", "class Queue:\n"]
    with Engine.open(PairConfig(TARGET, ctx=CPP_CTX), plain=True) as e:
        ids = [e.target_model.tokenize(p) for p in prompts]
        want = _decode(e, ids, GBNF)
    with Engine.open(PairConfig(TARGET, DRAFT, n_max=6, parallel=3, ctx=CPP_CTX)) as e:
        got = _decode(e, ids, GBNF)
        model = e.target_model
        done = [t for t in got if model.is_eog(t[-1])]
        assert len(done) >= 2 and all(LINE.fullmatch(model.detokenize(t[:-1])) for t in done)
        g = Grammar(model, GBNF)
        assert all(g.cut(t) == len(t) for t in got)  # (the unfinished ones: a beginning the grammar allows)
        g.close()
    assert got == want


def test_drafts_are_cut_where_the_grammar_stops_allowing_them():
    with Engine.open(PairConfig(TARGET, DRAFT, n_max=6, ctx=CPP_CTX)) as e:
        g = Grammar(e.target_model, GBNF)
        ok = e.target_model.tokenize("    def f(x", add_special=False).tolist()
        assert g.cut(ok) == len(ok)
        assert g.cut(ok[:2] + e.target_model.tokenize("{", add_special=False).tolist() + ok[2:]) == 2
        assert g.cut(ok) == len(ok)  # (cutting leaves the grammar as it was)
        g.close()


def test_sampled_tokens_follow_the_grammars_distribution():
    """Temperature 1 over the whole vocabulary, the first token under a grammar of four words:
    speculative sampling (drafts from the draft model, rejected where the grammar forbids them)
    draws each word as often as the target's masked distribution says (chi-square)."""
    words = ["yes", "no", "maybe", "never"]
    gbnf = "root ::= " + " | ".join(f'"{w}"' for w in words)
    s = SamplerSettings(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)
    with Engine.open(PairConfig(TARGET, DRAFT, n_max=4, ctx=CPP_CTX, sampling=s)) as e:
        model = e.target_model
        prompt = model.tokenize("answer = ")
        first = {w: int(model.tokenize(w, add_special=False)[0]) for w in words}
        # the target's distribution of the first token under the grammar, from its own row
        with Engine.open(PairConfig(TARGET, ctx=CPP_CTX, sampling=s), plain=True) as plain:
            ctx = plain.target
            from ggspec.runtime import Batch
            b = Batch(ctx)
            b.clear().add_tokens(prompt, 0, 0, outputs="last")
            ctx.decode(b)
            masked = Grammar(model, gbnf).mask(np.array(ctx.logits_view()[-1]))
            p = np.exp(masked - masked.max())
            p /= p.sum()
        counts = Counter()
        for seed in range(300):
            (tokens,) = _decode(e, [prompt], gbnf, seed=seed)
            counts[tokens[0]] += 1
    keys = np.flatnonzero(p > 0).tolist()  # every token that starts a word ("y" as well as "yes")
    assert set(first.values()) <= set(keys) and sum(counts.values()) == 300 and set(counts) <= set(keys)
    f_exp = p[keys].astype(np.float64)
    assert chisquare([counts[k] for k in keys], f_exp / f_exp.sum() * 300).pvalue > 1e-3


def test_a_grammar_llama_cpp_cannot_parse_is_an_input_error():
    with Engine.open(PairConfig(TARGET, ctx=CPP_CTX), plain=True) as e:
        with pytest.raises(InputError) as exc:
            e.add(Request(e.target_model.tokenize("x"), 4, grammar="root ::= undefined-rule"))
        assert exc.value.field == "grammar" and not e.active


# --- `ggspec run` under a grammar or a JSON schema ------------------------------------------------


def test_run_follows_a_grammar_or_a_schema_and_checks_against_plain(tiny_coder_pair):
    """llama-cli's --grammar / -j on `ggspec run`: the output follows them, speculating at a fixed
    length, and --check finds it identical to plain greedy under the same constraint."""
    import json

    from conftest import run_cli

    base = ("run", "-m", str(tiny_coder_pair.target), "-md", str(tiny_coder_pair.draft), "-t", "1",
            "--spec-draft-n-max", "7", "--check", "--no-compare")
    proc = run_cli(*base, "-n", "40", "-p", STACK, "--grammar", GBNF)
    assert proc.returncode == 0, proc.stderr
    assert LINE.fullmatch(proc.stdout[len(STACK):].rstrip("\n") + "\n"), proc.stdout
    assert "check: identical to plain greedy" in proc.stderr and "τ" in proc.stderr
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    proc = run_cli(*base, "-n", "60", "-p", "A person as JSON:", "-j", json.dumps(schema))
    assert proc.returncode == 0, proc.stderr
    person = json.loads(proc.stdout[len("A person as JSON:"):])
    assert set(person) == {"name", "age"} and isinstance(person["age"], int)
    assert "check: identical to plain greedy" in proc.stderr


@pytest.mark.parametrize("args, needle", [
    (("--grammar", "root ::= nope"), "--grammar: llama.cpp cannot parse this grammar"),
    (("--grammar", "  "), "--grammar: the grammar is empty"),
    (("-j", "{bad"), "-j: not JSON"),
    (("-j", "{}", "--grammar", 'root ::= "a"'), "--grammar and -j are exclusive"),
    (("--grammar-file", "/nonexistent.gbnf"), "--grammar-file /nonexistent.gbnf: no such file"),
])
def test_run_refuses_a_bad_grammar_in_one_line(tiny_coder_pair, args, needle):
    from conftest import run_cli

    proc = run_cli("run", "-m", str(tiny_coder_pair.target), "--no-spec", "-t", "1", "-n", "4", "-p", "x", *args)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr
