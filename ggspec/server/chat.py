"""Chat messages -> one prompt text, with the model's chat template.

The model's own template (its GGUF's `tokenizer.chat_template`, Jinja) is rendered with jinja2 in
a sandbox, as Hugging Face's tokenizers and llama-server's --jinja do; a template file given to
the server is rendered the same way. A built-in template name (chatml, gemma, llama3, ...) is
rendered by llama.cpp's own `llama_chat_apply_template`. A model without a template gets chatml,
as in llama-server.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ggspec.errors import InputError

# a model without a template gets llama-server's: chatml, as the Jinja source its /props shows
# (llama.cpp's common/chat.cpp, CHATML_TEMPLATE_SRC)
FALLBACK = "chatml"
CHATML_SOURCE = ("{%- for message in messages -%}\n"
                 "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
                 "{%- endfor -%}\n"
                 "{%- if add_generation_prompt -%}\n"
                 "  {{- '<|im_start|>assistant\n' -}}\n"
                 "{%- endif -%}")


@dataclass(frozen=True)
class Message:
    role: str
    content: str


def builtin_names(lc) -> list[str]:
    """llama.cpp's built-in template names."""
    n = lc.llama_chat_builtin_templates((ctypes.c_char_p * 1)(), 0)
    names = (ctypes.c_char_p * n)()
    lc.llama_chat_builtin_templates(names, n)
    return sorted(name.decode() for name in names)


class ChatTemplate:
    """`render(messages)` gives the prompt text (ending with the assistant's turn opened);
    `source` says where the template came from (for /v1/models and the start-up line), `text`
    is the template itself (a built-in one's name)."""

    def __init__(self, model, name: str | None = None, path: Path | None = None) -> None:
        """`model`: the target (runtime.Model); `name`: a llama.cpp built-in template;
        `path`: a Jinja template file. Neither: the model's own, else chatml."""
        if name is not None and path is not None:
            raise InputError("give a built-in template name or a template file, not both", field="chat_template")
        self._lc, self._model = model.lc, model
        self.bos = self._special_text(self._lc.llama_vocab_bos(model.vocab))
        self.eos = self._special_text(self._lc.llama_vocab_eos(model.vocab))
        self._jinja = None
        self._builtin: str | None = None
        if path is not None:
            self.text = _read(path)
            self._jinja = _compile(self.text, f"--chat-template-file {path}")
            self.source = f"file {path}"
        elif name is not None:
            names = builtin_names(self._lc)
            if name not in names:
                raise InputError(f"unknown built-in chat template '{name}' (llama.cpp has: {', '.join(names)})",
                                 field="chat_template")
            self._builtin, self.source = name, f"built-in {name}"
        else:
            own = self._lc.llama_model_chat_template(model.ptr, None)
            if own:
                self.text = own.decode("utf-8", "replace")
                self._jinja = _compile(self.text, "the model's chat template")
                self.source = "the model's (GGUF tokenizer.chat_template)"
            else:
                self.text = CHATML_SOURCE
                self._jinja = _compile(self.text, "llama.cpp's chatml template")
                self.source = f"{FALLBACK} (the model has no chat template; llama-server's)"
        if self._builtin is not None:
            self.text = self._builtin  # (llama-server's /props shows a built-in template by its name too)

    def _special_text(self, token: int) -> str:
        if token < 0:
            return ""
        text = self._lc.llama_vocab_get_text(self._model.vocab, token)
        return text.decode("utf-8", "replace") if text else ""

    def render(self, messages: list[Message]) -> str:
        if self._jinja is not None:
            from jinja2 import TemplateError

            try:
                return self._jinja.render(messages=[{"role": m.role, "content": m.content} for m in messages],
                                          add_generation_prompt=True, bos_token=self.bos, eos_token=self.eos)
            except TemplateError as exc:
                raise InputError(f"the chat template refused these messages: {exc}", field="messages") from None
        return self._apply_builtin(messages)

    def starts_with_bos(self, text: str) -> bool:
        """Whether the rendered text already holds the BOS token (then tokenizing adds none)."""
        return bool(self.bos) and text.startswith(self.bos)

    def _apply_builtin(self, messages: list[Message]) -> str:
        lc = self._lc
        keep = [(m.role.encode(), m.content.encode()) for m in messages]  # alive during the call
        chat = (lc.llama_chat_message * len(keep))(*[lc.llama_chat_message(r, c) for r, c in keep])
        size = 2 * sum(len(r) + len(c) for r, c in keep) + 256
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = lc.llama_chat_apply_template(self._builtin.encode(), chat, len(keep), True, buf, size)
            if n < 0:
                raise InputError(f"llama.cpp's '{self._builtin}' chat template cannot render these messages",
                                 field="messages")
            if n <= size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n  # the first call said how much room it needs
        raise InputError("the chat template's output did not fit its buffer", field="messages")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the chat template file {path}: {getattr(exc, 'strerror', None) or exc}",
                         field="chat_template_file") from None


def _compile(source: str, what: str):
    """A Jinja template in a sandbox, with the helpers chat templates expect."""
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise InputError("rendering a Jinja chat template needs jinja2: pip install 'ggspec[serve]'") from None

    def raise_exception(message: str):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise InputError(f"{what} is not a valid Jinja template: {exc}", field="chat_template_file") from None
