"""Bounds the CLI's options and the Python API check alike (a light module: the CLI imports it before anything)."""

import os

MIN_SEQ_LEN = 32                     # export: shorter KV buffers hold no useful prompt
MAX_DRAFT_LIMIT = 32                 # export: the largest --max-draft (verify calls of up to 33 rows)
# onnxruntime starts every intra-op thread it is asked for: 100000 took 16 GB before the kernel killed the process
MAX_THREADS = 4 * (os.cpu_count() or 1)
