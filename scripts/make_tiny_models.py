#!/usr/bin/env python3
"""Write the tiny random-weight target + DFlash draft GGUFs used by the tests.

    python scripts/make_tiny_models.py OUT_DIR [--kind dense|hybrid|all] [--seed N] [--block-size N]

Prints one line per file: path, size in bytes, sha256. Same arguments -> same bytes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# runnable from a checkout without installing the package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggspec.catalogue.tiny import KINDS, write_tiny_pair  # noqa: E402
from ggspec.files import file_sha256  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--kind", choices=[*KINDS, "all"], default="all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-size", type=int, default=8, help="DFlash block size (default 8)")
    args = ap.parse_args(argv)

    kinds = KINDS if args.kind == "all" else (args.kind,)
    for kind in kinds:
        pair = write_tiny_pair(args.out_dir, kind=kind, seed=args.seed, block_size=args.block_size)
        for path in (pair.target, pair.draft):
            print(f"{path}  {path.stat().st_size}  {file_sha256(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
