"""Finding the other loaders of ``tokens.py`` (LitData, Mosaic Streaming) for its child
processes: whether each imports, its version, and the licence its wheel ships.

Mosaic Streaming's package imports torchvision at import time (for its image datasets,
which a token reader never uses). Where torchvision does not load (PyPI's wheel needs
CUDA's libraries beside a CPU build of torch), the child gets a stand-in module of the
two names Mosaic imports, ``VisionDataset`` as torch's ``Dataset`` and a ``to_tensor``
that refuses, so that the rest of Mosaic runs as released. The report says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# What each method imports, and the distribution whose licence it reports.
LIBRARIES = {
    "litdata": ("litdata", "from litdata import StreamingDataset, TokensLoader, optimize"),
    "mosaic": ("mosaicml-streaming", "from streaming import MDSWriter, StreamingDataset"),
}

_PROBE = """
import importlib.metadata as md, json, sys
exec(sys.argv[2])
dist = md.distribution(sys.argv[1])
license_text = ""
for f in dist.files or []:
    if "license" in f.name.lower():
        license_text = f.read_text() or ""
        break
head = " ".join(line.strip() for line in license_text.splitlines() if line.strip())[:80]
meta = dist.metadata
print(json.dumps({
    "version": dist.version,
    "license_field": meta.get("License-Expression") or meta.get("License") or "",
    "license_file": head,
}))
"""

_SHIM = {
    "torchvision/__init__.py": '"""Stand-in for tokens.py: see benchmarks/tokens_libs.py."""\n',
    "torchvision/datasets/__init__.py": "from torch.utils.data import Dataset as VisionDataset\n",
    "torchvision/transforms/__init__.py": "",
    "torchvision/transforms/functional.py": (
        "def to_tensor(pic):\n"
        "    raise NotImplementedError('torchvision stand-in of benchmarks/tokens_libs.py')\n"
    ),
}


def _probe(name: str, path: str | None) -> tuple[dict[str, Any] | None, str]:
    distribution, imports = LIBRARIES[name]
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _PROBE, distribution, imports],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        return None, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found, ""


def probe_libraries(libs: str | None, scratch: Path) -> dict[str, dict[str, Any]]:
    """For each library: ``ok``, the ``path`` its children need, ``version``, the licence
    (the metadata's field and the start of the wheel's licence file) or the ``error``."""
    found: dict[str, dict[str, Any]] = {}
    for name in LIBRARIES:
        info, error = _probe(name, libs)
        note = ""
        if info is None and "torchvision" in error:
            first_error = error
            shim = scratch / "shim"
            for rel, text in _SHIM.items():
                (shim / rel).parent.mkdir(parents=True, exist_ok=True)
                (shim / rel).write_text(text)
            path = os.pathsep.join(filter(None, [libs, str(shim)]))
            info, error = _probe(name, path)
            note = f"with a torchvision stand-in (torchvision did not import: {first_error})"
        else:
            path = libs or ""
        if info is None:
            found[name] = {"ok": False, "error": error}
            print(f"[tokens] {name}: not run ({error})", flush=True)
            continue
        found[name] = {"ok": True, "path": path, "note": note, **info}
        print(
            f"[tokens] {name} {info['version']}: licence {info['license_field'] or '?'} "
            f"({info['license_file'][:40]}){'; ' + note if note else ''}",
            flush=True,
        )
    return found
