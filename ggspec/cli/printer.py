"""`ggspec run`'s output: each prompt's text on stdout in the prompts' order, and its stats line.

With several prompts decoded together (-f with -np > 1) outputs finish in any order; the
`OrderedPrinter` streams the first unfinished one and holds the others, so stdout reads as the
prompts did. Each output ends with `stats_line` on stderr.
"""

from __future__ import annotations

import codecs
import sys

from ggspec.cli.console import err


class OrderedPrinter:
    """Writes each prompt's output in prompt order: the first unfinished one streams, later ones
    are held until every output before them is printed; each ends with its stats line."""

    def __init__(self, prompts: list[str], engine) -> None:
        self.prompts, self.engine = prompts, engine
        self.held: dict[int, list[bytes]] = {i: [] for i in range(len(prompts))}
        self.finished: dict[int, object] = {}
        self.head = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.started = False

    def add(self, i: int, tokens: list[int]) -> None:
        """Prompt i's newly committed tokens (printed now if it is the head, else held)."""
        self.held[i].append(b"".join(self.engine.target_model.token_bytes(t) for t in tokens))
        if i == self.head:
            self._write_head()

    def finish(self, i: int, stats) -> None:
        """Prompt i is done: print every output now complete in order, each with its stats line."""
        self.finished[i] = stats
        while self.head < len(self.prompts):
            self._write_head()
            if self.head not in self.finished:
                break
            self._end_head()

    def _write_head(self) -> None:
        out = sys.stdout
        if not self.started:
            out.write(self.prompts[self.head])
            self.started = True
        out.write(self.decoder.decode(b"".join(self.held[self.head])))
        self.held[self.head].clear()
        out.flush()

    def _end_head(self) -> None:
        sys.stdout.write(self.decoder.decode(b"", final=True) + "\n")
        sys.stdout.flush()
        self.decoder.reset()
        err.print(stats_line(self.finished.pop(self.head), self.engine), soft_wrap=True)
        del self.held[self.head]
        self.head += 1
        self.started = False


def stats_line(s, sp) -> str:
    """One sequence's stats (RunStats `s` on engine `sp`): speed, and with speculation τ, acceptance
    and where the time went (replay and planes for a recurrent target)."""
    line = (f"[bold]{s.n_generated} tokens[/]  decode {s.decode_tps:.1f} t/s  "
            f"prompt {s.prompt_tps:.1f} t/s ({s.n_prompt} tokens)")
    if not sp.speculative:
        return line + "  (no speculation)"
    if sp.plain_by_cost:
        return line + f"  (plain: no {sp.plan.spec_type} draft length ≤ {sp.n_max} pays on this machine)"
    sh = s.time_shares()
    length = f"auto ≤ {sp.n_max}" if sp.draft_length is not None else f"n_max {sp.n_max}"
    line += (f"  τ {s.tau:.2f} (pooled: committed/steps, {sp.plan.spec_type} {length})  "
             f"accept {100 * s.acceptance_rate:.1f}%  "
             f"time: draft {100 * sh['draft']:.0f}% verify {100 * sh['verify']:.0f}% "
             f"inject {100 * sh['inject']:.0f}% overhead {100 * sh['overhead']:.0f}%")
    if s.k_hist:
        line += f"  auto: {s.k_summary} of steps"
    if sp.tree_rule is not None and s.spec_steps:
        budget = "auto" if sp.tree_rule.auto else str(sp.tree_rule.cap)
        line += (f"  trees ({budget}): {100 * s.tree_steps / s.spec_steps:.0f}% of steps, "
                 f"{s.nodes / s.spec_steps:.1f} nodes/step")
    if sp.target_model.is_recurrent:
        line += (f"  replay {100 * s.replay_share:.0f}% of steps ({100 * sh['replay']:.0f}% of time)  "
                 f"planes: {sp.plane_layout}, {sp.recurrent_bytes() / 1024:.0f} KiB recurrent state")
    return line
