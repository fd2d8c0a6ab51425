"""How far int4 rounding moves a real model's weights: min-max against least squares, per block size.

    python experiments/int4_rounding.py SOURCE.gguf [--layer 5] [--block-sizes 32,128] [--bits 4]

Reads every 2-D weight of one layer from the GGUF file (dequantized, as the exporter reads it), quantizes it both
ways (specedge/export/quantize.py) and prints the relative error |W' - W| / |W| of each, with the time each took.
Weight error is a proxy; experiments/block_size_quality.py measures what it does to the model on real text.
"""

import argparse
import sys
import time

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("--layer", type=int, default=5)
    parser.add_argument("--block-sizes", default="32,128")
    parser.add_argument("--bits", type=int, default=4)
    args = parser.parse_args()
    from gguf import GGUFReader, dequantize

    from specedge.export.quantize import Quantization
    from specedge.export.quantize import dequantize as matmul_nbits_weights
    from specedge.export.quantize import quantize

    reader = GGUFReader(args.source)
    prefix = f"blk.{args.layer}."
    tensors = [t for t in reader.tensors if t.name.startswith(prefix) and len(t.shape) == 2]
    if not tensors:
        sys.exit(f"no 2-D tensors named {prefix}* in {args.source}")
    sizes = [int(b) for b in args.block_sizes.split(",")]
    print("tensor (stored as) | " + " | ".join(f"block {b}: min-max / lsq (error, seconds)" for b in sizes))
    totals = {(b, r): [0.0, 0.0, 0.0] for b in sizes for r in ("minmax", "lsq")}     # error², norm², seconds
    for tensor in tensors:
        weight = np.asarray(dequantize(tensor.data, tensor.tensor_type), np.float32)
        weight = weight.reshape(int(tensor.shape[1]), int(tensor.shape[0]))           # [out, in]
        cells = []
        for block in sizes:
            cell = []
            for rounding in ("minmax", "lsq"):
                q = Quantization(args.bits, block, 4, rounding)
                start = time.perf_counter()
                parts = quantize(weight, q)
                seconds = time.perf_counter() - start
                error = np.square(matmul_nbits_weights(*parts, weight.shape[1], q) - weight).sum()
                norm = np.square(weight).sum()
                total = totals[block, rounding]
                total[0], total[1], total[2] = total[0] + error, total[1] + norm, total[2] + seconds
                cell.append(f"{np.sqrt(error / norm):.4f} ({seconds:.1f} s)")
            cells.append(" / ".join(cell))
        print(f"{tensor.name.removeprefix(prefix)} ({tensor.tensor_type.name}) | " + " | ".join(cells))
    print("all | " + " | ".join(" / ".join(f"{np.sqrt(totals[b, r][0] / totals[b, r][1]):.4f} ({totals[b, r][2]:.1f} s)"
                                          for r in ("minmax", "lsq")) for b in sizes))


if __name__ == "__main__":
    main()
