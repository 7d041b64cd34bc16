"""The ggml-level snapshot-map test (tests/native/test_gdn_map_gpu.c), compiled against a build."""

from __future__ import annotations

import subprocess
from pathlib import Path

MAP_TEST = Path(__file__).parents[1] / "native" / "test_gdn_map_gpu.c"
SKIP_EXIT = 77  # the C test's "no GPU device"


def compile_map_test(build_info, folder: Path) -> Path:
    """The test's executable, linked to `build_info`'s libggml (its first GPU device is tested)."""
    tree = Path(build_info.root) / "llama.cpp"
    lib = build_info.lib_dir
    exe = folder / "test_gdn_map_gpu"
    subprocess.run(["cc", "-O2", "-std=c11", str(MAP_TEST), f"-I{tree}/ggml/include", f"-L{lib}", "-lggml",
                    "-lggml-base", "-lm", f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)
    return exe
