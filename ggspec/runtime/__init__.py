"""Runtime layer: small owning wrappers over llama.cpp models, contexts and batches."""

from ggspec.runtime.batch import Batch
from ggspec.runtime.context import Context, ContextParams
from ggspec.runtime.model import Model

__all__ = ["Batch", "Context", "ContextParams", "Model"]
