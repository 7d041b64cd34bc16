"""The build: the patch series applies to the pristine pin, the shim resolves, builds are cached."""

from __future__ import annotations

import shutil
import time

import pytest

from ggspec.native import build as nb
from ggspec.native import paths


def test_patch_series_applies_to_the_pristine_pin(tmp_path, build_info):
    patches = nb.patch_files()
    assert [p.name for p in patches] == build_info.patches
    assert [p.name[:5] for p in patches] == [f"{i:04d}-" for i in range(1, len(patches) + 1)]  # no gaps
    tree = nb.prepare_tree(tmp_path, patches)
    assert (tree / "src" / "ggspec-shim.cpp").is_file()
    assert "ggml_gated_delta_net_set_snapshot_map" in (tree / "ggml" / "include" / "ggml.h").read_text()
    assert "LLAMA_ARG_SPEC_DFLASH_DEFER" in (tree / "common" / "arg.cpp").read_text()


def test_a_patch_that_does_not_apply_names_patch_and_hunk(tmp_path, monkeypatch, build_info):
    bad_dir = tmp_path / "patches"
    bad_dir.mkdir()
    text = nb.patch_files()[0].read_text()
    # change a context line so the CMakeLists hunk no longer matches the pristine file
    (bad_dir / "0001-c-abi-shim.patch").write_text(text.replace(" llama-vocab.cpp", " llama-vocabX.cpp", 1))
    monkeypatch.setenv("GGSPEC_PATCHES", str(bad_dir))
    with pytest.raises(nb.BuildError) as exc:
        nb.prepare_tree(tmp_path / "tree", nb.patch_files())
    msg = str(exc.value)
    assert "0001-c-abi-shim.patch" in msg and "src/CMakeLists.txt" in msg, msg


def test_patch_names_are_checked(tmp_path, monkeypatch):
    (tmp_path / "fix.patch").write_text("")
    monkeypatch.setenv("GGSPEC_PATCHES", str(tmp_path))
    with pytest.raises(nb.BuildError, match="NNNN-name.patch"):
        nb.patch_files()


def test_shim_functions_resolve(lc):
    lib = lc._lib
    from ggspec.native.bindings import SHIM_ABI_VERSION

    assert lib.ggspec_shim_abi_version() == SHIM_ABI_VERSION == 9
    for name in ("ggspec_set_embeddings_layer_inp", "ggspec_get_embeddings_layer_inp",
                 "ggspec_model_target_layer_ids", "ggspec_model_target_layer_ids_n",
                 "ggspec_set_embeddings_nextn", "ggspec_get_embeddings_nextn",
                 "ggspec_get_embeddings_nextn_ith", "ggspec_model_dflash_selector_top_k",
                 "ggspec_batch_add_tokens", "ggspec_batch_add_embd_rows", "ggspec_batch_add_layer_inputs",
                 "ggspec_set_rs_planes", "ggspec_rs_kept_counts", "ggspec_rs_can_rollback",
                 "ggspec_set_mtp_chain", "ggspec_mtp_chain_result", "ggspec_model_set_draft_vocab",
                 "ggspec_batch_add_tokens_h", "ggspec_set_plan_pool", "ggspec_get_plan_stats",
                 "ggspec_copy_layer_inputs"):
        assert hasattr(lib, name), f"{name} is missing from libllama"
        assert getattr(lib, name).argtypes is not None, f"{name} was not declared (ggspec.native.bindings)"


def test_target_layer_ids_through_the_shim(lc, dense_pair):
    from ggspec.runtime import Model
    from ggspec.speculative.types.dflash import dflash_info

    with Model(dense_pair.draft) as m:
        n = lc._lib.ggspec_model_target_layer_ids_n(m.ptr)
        ids = lc._lib.ggspec_model_target_layer_ids(m.ptr)
        assert tuple(ids[i] for i in range(n)) == dflash_info(m.meta).target_layers


def test_second_build_is_a_cache_hit(build_info):
    t0 = time.perf_counter()
    info = nb.build(nb.current_options())
    assert info.cached and info.key == build_info.key
    assert time.perf_counter() - t0 < 1.0


def test_key_follows_patches_options_and_cpu(tmp_path, monkeypatch):
    base = nb.build_key(nb.BuildOptions())
    assert nb.build_key(nb.BuildOptions(tools=True)) == base  # targets live in build.json, not the key
    assert nb.build_key(nb.BuildOptions(cuda=True)) != base
    assert nb.build_key(nb.BuildOptions(native=False)) != base
    copy = tmp_path / "patches"
    shutil.copytree(paths.patches_dir(), copy)
    monkeypatch.setenv("GGSPEC_PATCHES", str(copy))
    assert nb.build_key(nb.BuildOptions()) == base
    first = sorted(copy.glob("*.patch"))[0]
    first.write_bytes(first.read_bytes() + b"\n")
    assert nb.build_key(nb.BuildOptions()) != base


def test_tools_build_serves_plain_and_plain_build_is_extended(tmp_path, monkeypatch):
    """A newcomer's two commands compile llama.cpp once: `build --tools` satisfies `build`, and
    `build --tools` after `build` compiles only the tools, in the same configured directory."""
    monkeypatch.setenv("GGSPEC_HOME", str(tmp_path))
    plain, tools = nb.BuildOptions(), nb.BuildOptions(tools=True)
    root = tmp_path / "builds" / nb.build_key(plain)
    (root / "build" / "bin").mkdir(parents=True)
    (root / "build" / "bin" / "libllama.so").write_bytes(b"")
    (root / "build" / "CMakeCache.txt").write_text("")
    (root / "llama.cpp").mkdir()
    info = nb.BuildInfo(key=nb.build_key(plain), root=str(root), lib_dir=str(root / "build" / "bin"),
                        options={"tools": False}, patches=[], cpu_target="x", seconds=100.0,
                        targets=list(nb.LIBRARY_TARGETS))
    nb._write_info(root, info)
    assert nb.find_build(plain) is not None and nb.find_build(tools) is None

    compiled = []
    monkeypatch.setattr(nb, "compile_tree", lambda tree, bdir, opts, targets, on_line: compiled.append(
        (tree, bdir, list(targets))))
    extended = nb.build(tools)
    assert compiled == [(root / "llama.cpp", root / "build", list(nb.TOOL_TARGETS))]
    assert set(extended.targets) == set(nb.LIBRARY_TARGETS + nb.TOOL_TARGETS) and extended.options["tools"]
    assert nb.find_build(tools) is not None and nb.find_build(plain).key == extended.key

    again = nb.build(plain)  # the tools build serves the plain request: nothing compiled
    assert again.cached and len(compiled) == 1 and nb.current_options().tools


def test_gpu_options_produce_the_ggml_flags():
    args = nb.BuildOptions(cuda=True, vulkan=True, tools=True).cmake_args()
    assert "-DGGML_CUDA=ON" in args and "-DGGML_VULKAN=ON" in args and "-DGGML_RPC=ON" in args
    assert "-DLLAMA_CURL=OFF" in args  # nothing is fetched during a build
    assert "ggml-rpc-server" in nb.BuildOptions().targets() and "-DGGML_RPC=ON" in nb.BuildOptions().cmake_args()
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in nb.BuildOptions(cuda=True, cuda_arch="90").cmake_args()


def test_a_vulkan_build_adds_the_op_test_and_keeps_the_cpu_key():
    vulkan, cpu = nb.BuildOptions(vulkan=True), nb.BuildOptions()
    assert "-DLLAMA_BUILD_TESTS=ON" in vulkan.cmake_args() and nb.BACKEND_OPS_TEST in vulkan.targets()
    assert "-DLLAMA_BUILD_TESTS=OFF" in cpu.cmake_args() and nb.BACKEND_OPS_TEST not in cpu.targets()


def test_vulkan_without_its_packages_is_one_line_naming_them(monkeypatch):
    from ggspec.native import vulkan

    monkeypatch.setattr(vulkan, "_glslc", lambda: None)
    monkeypatch.setattr(vulkan, "_spirv_headers", lambda: None)
    with pytest.raises(nb.BuildError) as exc:
        nb.check_options(nb.BuildOptions(vulkan=True))
    text = str(exc.value)
    assert "glslc" in text and "spirv-headers" in text and "apt-get install" in text and "\n" not in text


def test_a_build_selected_by_key_that_does_not_exist_is_one_line(monkeypatch, build_info, tiny_coder_pair):
    from conftest import run_cli

    proc = run_cli("run", "-m", str(tiny_coder_pair.target), "-p", "hi", "--no-spec",
                   env={nb.SELECT_ENV: "0123456789abcdef"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{nb.SELECT_ENV}=0123456789abcdef: no finished build" in proc.stderr.strip().splitlines()[-1]
    monkeypatch.setenv(nb.SELECT_ENV, build_info.key)
    assert nb.current_options() == nb._options(build_info.options)  # the named build, whatever is current


def test_cuda_without_a_gpu_needs_an_arch(monkeypatch):
    monkeypatch.setattr(nb.shutil, "which", lambda name: None)
    with pytest.raises(nb.BuildError, match="--cuda-arch"):
        nb.check_options(nb.BuildOptions(cuda=True))
    nb.check_options(nb.BuildOptions(cuda=True, cuda_arch="90"))


def test_only_one_llama_cpp_is_loaded(lc, build_info):
    """The bindings load ggspec's patched libllama, not a second native build."""
    import llama_cpp

    assert llama_cpp.__path__ == [str(paths.sdist_dir() / "llama_cpp")]
    maps = open("/proc/self/maps").read()
    libs = {line.split()[-1] for line in maps.splitlines() if "libllama" in line}
    assert libs and all(lib.startswith(build_info.lib_dir) for lib in libs), libs


def test_quantized_models_run_on_this_cpu(tmp_path, dense_pair, lc):
    """Quantized matmuls use the CPU's best kernels; on hosts that list AMX but trap it, the
    build compiles AMX out (native_fixups), so a q8_0 / q4_0 target must run, not die."""
    import ctypes

    from conftest import run_cli

    for ftype, name in ((7, "q8_0"), (2, "q4_0")):
        out = tmp_path / f"target-{name}.gguf"
        params = lc.llama_model_quantize_default_params()
        params.ftype = ftype
        params.nthread = 1
        assert lc.llama_model_quantize(str(dense_pair.target).encode(), str(out).encode(),
                                       ctypes.byref(params)) == 0
        proc = run_cli("run", "-m", str(out), "-md", str(dense_pair.draft), "-n", "16", "--ignore-eos")
        assert proc.returncode == 0, proc.stderr[-500:]
        assert "16 tokens" in proc.stderr
