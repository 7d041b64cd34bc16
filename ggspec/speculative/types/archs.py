"""Target architectures whose graph, in ggspec's patched llama.cpp, exposes its layer inputs.

A DFlash draft reads the target's hidden states at the *input* of chosen layers
(``llama_set_embeddings_layer_inp``). llama.cpp only has them where the model graph stores
``res->t_layer_inp[il] = inpL`` in its per-layer loop; for any other architecture, enabling a
layer input aborts the process in ``llm_graph_result::set_outputs`` ("layer input tensor is
null"). So a target's ``general.architecture`` must be checked against this set before a DFlash
pair is loaded.

Architecture names are the GGUF ``general.architecture`` strings (``llama-arch.cpp``). Several
names share one graph (``minicpm``, ``granitemoe`` -> granite; ``phimoe`` -> phi3;
``llama-embed`` -> llama; ``lfm2moe`` -> lfm2; ``hunyuan-dense`` -> hunyuan_vl;
``nemotron_h_moe`` -> nemotron_h), and they are listed as the graph they run.
``tests/test_layer_inputs.py`` checks these sets against the patched tree of the current build.
"""

from __future__ import annotations

__all__ = ["DRAFTER_ARCHS", "FINAL_STATE_ARCHS", "LAYER_INPUT_ARCHS", "PATCHED_LAYER_INPUT_ARCHS",
           "UPSTREAM_LAYER_INPUT_ARCHS", "is_mtp_drafter"]

# The pinned tree (llama-cpp-python 0.3.36's vendored llama.cpp) already extracts these.
UPSTREAM_LAYER_INPUT_ARCHS: frozenset[str] = frozenset({
    "bailingmoe3", "deepseek4", "gemma4", "gpt-oss", "hunyuan-dense", "hunyuan_vl", "lfm2", "lfm2moe",
    "llama", "llama-embed", "mimo2", "minimax-01", "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h",
    "nemotron_h_moe", "qwen3", "qwen35", "qwen35moe", "qwen3moe", "qwen3next", "qwen4exp",
})

# Patch 0006-layer-inputs-more-archs adds the extraction to these graphs: gemma, gemma2, gemma3,
# qwen2, phi3 (also run by phimoe), mistral3, olmo2 (OLMo 2 and 3), starcoder2, granite (also
# run by granitemoe and minicpm) and smollm3.
PATCHED_LAYER_INPUT_ARCHS: frozenset[str] = frozenset({
    "gemma", "gemma2", "gemma3", "granite", "granitemoe", "minicpm", "mistral3", "olmo2", "phi3", "phimoe",
    "qwen2", "smollm3", "starcoder2",
})

# Every architecture of the patched build whose layer inputs a DFlash draft can read.
LAYER_INPUT_ARCHS: frozenset[str] = UPSTREAM_LAYER_INPUT_ARCHS | PATCHED_LAYER_INPUT_ARCHS

# The graphs that export a final hidden state (`res->t_h_nextn`, read by llama_get_embeddings_nextn)
# in the pinned tree: the MTP targets and Gemma 4, for their drafters. An EAGLE3 head whose
# target_layers name the target's n_layer reads that state; for any other architecture llama.cpp
# reads a buffer the graph never writes (zeros, or stale rows once it grows).
FINAL_STATE_ARCHS: frozenset[str] = frozenset({
    "bailingmoe3", "cohere2moe", "deepseek2", "deepseek32", "deepseek4", "gemma4", "glm-dsa", "glm4moe", "glm5-next",
    "gpt-oss", "hy-v3", "mimo2", "nemotron_h", "nemotron_h_moe", "qwen35", "qwen35moe", "qwen3next", "step35",
})


# separate MTP drafters that read the target's KV cache (llama.cpp's shared-memory mode), and
# the target architecture each drafts for (draft-mtp; every draft-model type refuses them)
DRAFTER_ARCHS = {"gemma4-assistant": "gemma4"}


def is_mtp_drafter(meta) -> bool:
    return meta.arch in DRAFTER_ARCHS


def is_dflash(meta) -> bool:
    """A DFlash-family draft file (a GGUFMeta)."""
    return meta.arch == "dflash"
