"""The one error of the native layer, in a module of its own so that every native module can raise
it without importing another: build.py drives cuda.py (the toolkit a CUDA build configures with),
and cuda.py fails with the same one-line error the build does."""


class BuildError(RuntimeError):
    """A build step failed; the message is one line meant for the user."""
