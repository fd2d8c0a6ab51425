"""The runtime needs no torch or transformers; the exporter says which extra is missing."""

import subprocess
import sys

BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers', 'onnx', 'gguf', 'safetensors'):
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
sys.meta_path.insert(0, Block())
"""


def _python(code: str):
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=120)


def test_runtime_runs_without_torch(arch_bundles):
    proc = _python(f"""
from specedge.runtime import load
gen = load({str(arch_bundles['qwen2'])!r})
r = gen.generate('hello', max_new_tokens=12, k=3, ignore_eos=True)
assert len(r.tokens) == 12, r.tokens
assert 'torch' not in sys.modules and 'transformers' not in sys.modules
print('ok')
""")
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_export_without_extra_names_it(tmp_path):
    proc = _python(f"""
from specedge.cli import main
sys.exit(main(['export', '--target', 'a', '--draft', 'b', '--out', {str(tmp_path / 'b')!r}]))
""")
    assert proc.returncode == 1
    assert "pip install 'specedge[export]'" in proc.stderr and "Traceback" not in proc.stderr
