"""llama.cpp's own web UI (the pinned tree's `tools/ui`, a SvelteKit app), built once with npm.

llama-server embeds it; ggspec serves the same page. `ensure(log)` builds it where it is not
built yet: the pinned source's `tools/ui` copied to a scratch folder, `npm ci` (its
package-lock.json: the same packages every time), `npm run build` (LLAMA_UI_OUT_DIR: where the
static site goes), and the site moved under `$GGSPEC_HOME/ui/<key>`, the key a hash of the UI's
source files (a new pin is a new key). About 2 minutes on 2 cores, once (npm ci ~30 s, the build
~80 s); npm needs the npm registry, the page needs nothing at run time.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ggspec.native import paths
from ggspec.native.errors import BuildError

NPM_MISSING = "the web UI is built with npm, which is not installed (Debian: apt-get install npm)"


def source_dir() -> Path:
    """The UI's source in the pinned llama.cpp tree."""
    from ggspec.native.build import pristine_tree  # noqa: PLC0415

    return pristine_tree() / "tools" / "ui"


def source_key(src: Path) -> str:
    """A hash of the UI's source files (names and bytes)."""
    h = hashlib.sha256()
    for f in sorted(p for p in src.rglob("*") if p.is_file() and "node_modules" not in p.parts):
        h.update(str(f.relative_to(src)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def site_dir(key: str) -> Path:
    return paths.ggspec_home() / "ui" / key / "site"


def built(key: str | None = None) -> Path | None:
    """The built site of the pinned source (None: not built yet, or the source not unpacked);
    `key`: its source's hash, where the caller has it."""
    src = source_dir()
    if not src.is_dir():
        return None
    site = site_dir(key or source_key(src))
    return site if (site.parent / ".complete").is_file() else None


def ensure(log=print) -> Path:
    """The built site; built now where it is not (BuildError, one line, where it cannot be)."""
    from ggspec.native.build import extract_sdist, obtain_sdist  # noqa: PLC0415

    src = source_dir()
    if not src.is_dir():
        extract_sdist(obtain_sdist())
    key = source_key(src)  # (800 files: hashed once)
    if (site := built(key)) is not None:
        return site
    npm = shutil.which("npm")
    if npm is None:
        raise BuildError(NPM_MISSING)
    dest = site_dir(key).parent
    log(f"building llama.cpp's web UI once (npm ci + npm run build, ~2 min): {dest}")
    with tempfile.TemporaryDirectory(prefix="ggspec-ui-") as tmp:
        work, out = Path(tmp) / "ui", Path(tmp) / "site"
        shutil.copytree(src, work, ignore=shutil.ignore_patterns("node_modules", "dist", ".svelte-kit"))
        env = dict(os.environ, LLAMA_UI_OUT_DIR=str(out), CI="1")
        _npm([npm, "ci", "--no-audit", "--no-fund"], work, env, "npm ci")
        log("web UI: packages installed; building the site")
        _npm([npm, "run", "build"], work, env, "npm run build")
        if not (out / "index.html").is_file():
            raise BuildError(f"npm run build made no index.html in {out}")
        staging = dest.with_name(dest.name + ".part")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        shutil.move(str(out), staging / "site")
        (staging / ".complete").write_text(key)
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
    log(f"built llama.cpp's web UI: {dest / 'site'}")
    return dest / "site"


def _npm(cmd: list[str], cwd: Path, env: dict, what: str) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()][-1:] or ["(no output)"]
        raise BuildError(f"{what} failed building the web UI (exit {proc.returncode}): {tail[0][:300]}")
