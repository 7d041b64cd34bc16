"""User-facing errors: each carries a one-line message the CLI prints before exiting non-zero."""


class GGSpecError(Exception):
    """Base class for errors caused by the user's input or environment, not by a bug."""


class InputError(GGSpecError):
    """Bad arguments, files or model combinations, detected before llama.cpp is called.

    `field` names the setting at fault (a PairConfig / ContextParams field such as "n_max"):
    the CLI prefixes the message with its flag, a server would answer 400 naming the parameter."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ContextOverflow(InputError):
    """A prompt (with its budget and one verify block) needs more positions than a slot holds."""

    def __init__(self, message: str, field: str, n_prompt: int, n_ctx: int) -> None:
        super().__init__(message, field)
        self.n_prompt, self.n_ctx = n_prompt, n_ctx


class LlamaError(GGSpecError):
    """llama.cpp refused a request (returned NULL or an error code)."""


class ClosedError(GGSpecError):
    """A model, context or batch was used after `close()` (its llama.cpp handle is freed)."""
