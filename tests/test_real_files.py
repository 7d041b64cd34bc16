"""What real files look like: converter-made metadata and tensor types, MTP blocks counted in
block_count, and a real pretrained model from the package registry (tests marked `real`)."""

from __future__ import annotations

import pytest
from conftest import PROMPTS, REAL_PAIR, run_cli

from ggspec.catalogue.tiny import KINDS, ensure_tiny_pair, write_dflash_draft
from ggspec.errors import InputError
from ggspec.runtime import ContextParams
from ggspec.runtime.gguf_meta import GGUFArray, read_meta

GGML_F32, GGML_F16 = 0, 1


@pytest.mark.parametrize("kind", KINDS)
def test_fixtures_carry_what_converted_files_carry(kind, fixture_dir):
    pair = ensure_tiny_pair(fixture_dir, kind)
    target, draft = read_meta(pair.target), read_meta(pair.draft)
    for meta in (target, draft):
        assert meta.get("general.type") == "model" and meta.get("general.quantization_version") == 2
        assert all(t.ggml_type == GGML_F32 for t in meta.tensor_info if len(t.shape) == 1), "1-D tensors are F32"
    # the mask token belongs to the draft: converted targets have none
    assert target.get("tokenizer.ggml.mask_token_id") is None
    assert draft.get("tokenizer.ggml.mask_token_id") is not None
    assert all(t.ggml_type == GGML_F16 for t in draft.tensor_info if len(t.shape) == 2)
    if kind == "dense":  # F16 matrices like `--outtype f16` (the hybrid keeps F32 for its margins)
        assert all(t.ggml_type == GGML_F16 for t in target.tensor_info if len(t.shape) == 2)
        assert target.get("general.file_type") == 1
    else:
        recurrent = target.arch_key("attention.recurrent_layers")
        assert len(recurrent) == target.n_layer and recurrent[:4] == [True, False, True, False]
        assert recurrent[4:] == [False] * target.n_nextn  # MTP blocks are full attention


def test_mtp_block_counts_in_block_count_only(fixture_dir):
    meta = read_meta(ensure_tiny_pair(fixture_dir, "hybrid-mtp").target)
    assert (meta.n_layer, meta.n_nextn, meta.n_layer_main) == (5, 1, 4)
    assert {"blk.4.nextn.eh_proj.weight", "blk.4.nextn.enorm.weight"} <= meta.tensors


def test_a_draft_reading_the_mtp_block_is_refused(fixture_dir, tmp_path):
    """Converter-made Qwen3.5/3.6 files count the MTP block: a draft naming its index passed the
    layer check and llama.cpp aborted (t_layer_inp assert, exit 134). Now: one line, exit 1."""
    pair = ensure_tiny_pair(fixture_dir, "hybrid-mtp")
    draft = write_dflash_draft(tmp_path / "reads-mtp.gguf", target_kind="hybrid-mtp", seed=0, target_layers=[1, 4])
    proc = run_cli("run", "-m", str(pair.target), "-md", str(draft), "-n", "4")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert "layers 0..3" in proc.stderr and "MTP block" in proc.stderr, proc.stderr


def test_mtp_target_runs_lossless(fixture_dir, build_info):
    """The MTP block is loaded but never run: speculation over the trunk equals plain greedy."""
    from ggspec.speculative.engine import Engine
    from ggspec.speculative.lossless import run_prompts
    from ggspec.speculative.models import PairConfig

    pair = ensure_tiny_pair(fixture_dir, "hybrid-mtp")
    ctx = ContextParams(n_ctx=512, n_batch=128, n_ubatch=128, n_threads=1, type_k="f32", type_v="f32", flash_attn="off")
    with Engine.open(PairConfig(target=pair.target, draft=pair.draft, fixed_block=True, n_max=7, ctx=ctx)) as sp:
        assert sp.target_model.n_layer == 4 and sp.target_model.is_recurrent
        runs = list(run_prompts(sp, PROMPTS[:4], 48, None))
    failures = [f"prompt {i}: {r.divergence.describe()}" for i, r in enumerate(runs) if r.divergence]
    assert not failures, "\n".join(failures)


# --- the real pretrained model -------------------------------------------------------------------


@pytest.mark.real
def test_real_model_metadata_is_read_without_its_vocabulary(real_target):
    meta = read_meta(real_target, "target")
    assert (meta.arch, meta.n_embd, meta.n_layer, meta.n_vocab) == ("gemma3", 640, 18, 262_144)
    assert isinstance(meta.get("tokenizer.ggml.tokens"), GGUFArray)  # 262k entries never decoded


@pytest.mark.real
def test_real_pair_runs_plain_from_its_name(real_target, build_info):
    proc = run_cli("run", "--pair", REAL_PAIR, "--no-spec", "-n", "12", "--ignore-eos", "-p", "The capital of France is")
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "12 tokens" in proc.stderr and "(no speculation)" in proc.stderr
    assert proc.stdout.startswith("The capital of France is") and len(proc.stdout) > len("The capital of France is")


@pytest.mark.real
def test_real_pair_without_a_draft_says_what_it_drafts_with(real_target, build_info):
    """A target-only pair drafts from the text (the lone-model default), and says so."""
    proc = run_cli("run", "--pair", REAL_PAIR, "-n", "4", "-p", "Hello")
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "drafts from the text itself (suffix)" in proc.stderr and "suffix auto" in proc.stderr


def test_a_pair_that_is_not_pulled_says_what_to_run(tmp_path, build_info):
    proc = run_cli("run", "--pair", REAL_PAIR, "--no-spec", env={"GGSPEC_HOME": str(tmp_path)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"ggspec models pull {REAL_PAIR}" in proc.stderr


def test_registry_entries_are_wellformed():
    from ggspec.catalogue.pairs import get_entry

    entry = get_entry(REAL_PAIR)
    assert entry.kind == "registry" and entry.draft is None and len(entry.target_sha256) == 64
    assert all("==" in p for p in entry.packages), "registry packages are pinned"
    with pytest.raises(InputError):
        from ggspec.catalogue.pairs import pull

        pull(get_entry("tiny-coder"))


def test_a_target_without_layer_inputs_is_refused_before_loading(fixture_dir, tmp_path):
    """Enabling a layer input on a graph that never stores it aborts llama.cpp: the architecture
    is checked against the patched build's list first (see ggspec.speculative.types.archs)."""
    import gguf

    from ggspec.catalogue.tiny import tiny_vocab

    path = tmp_path / "exaone.gguf"  # a dense arch neither upstream nor patch 0006 extracts from
    w = gguf.GGUFWriter(str(path), "exaone")
    w.add_key_value("exaone.embedding_length", 128, gguf.GGUFValueType.UINT32)
    w.add_key_value("exaone.block_count", 4, gguf.GGUFValueType.UINT32)
    w.add_key_value("tokenizer.ggml.tokens", list(tiny_vocab().tokens), gguf.GGUFValueType.ARRAY,
                    sub_type=gguf.GGUFValueType.STRING)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    proc = run_cli("run", "-m", str(path), "-md", str(ensure_tiny_pair(fixture_dir, "dense").draft), "-n", "4")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert "architecture 'exaone' does not expose its layer inputs" in proc.stderr, proc.stderr
