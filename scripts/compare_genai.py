"""Plain target-only decoding: specedge against onnxruntime-genai on the same weights, in one process.

    pip install onnxruntime-genai==0.18.0 onnx_ir          # dev only, not a specedge dependency
    python scripts/gguf_to_hf.py MODEL.gguf HF_FOLDER         # the same weights specedge exports
    python -m onnxruntime_genai.models.builder -i HF_FOLDER -o GENAI_DIR -p fp32 -e cpu   # or -p int4
    python scripts/compare_genai.py GENAI_DIR BUNDLE [--max-new-tokens 64] [--repeat 2] [--target-rows auto|1|2]

Both run with the same intra-op thread count (--threads, default: all logical CPUs, specedge's default):
onnxruntime-genai's own default is one thread here, which would halve its speed on 2 cores.
Greedy, the built-in bench prompts, the same prompt token ids for both (specedge's tokenizer), eos
ignored so both generate exactly --max-new-tokens; the two alternate per prompt, so drift hits both
alike. Prints median tokens/s (prefill included, as in `specedge bench`) and the share of prompts on
which both produced the same tokens.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import onnxruntime_genai as og

from plain_decode_race import race
from specedge.prompts import BUILTIN_PROMPTS
from specedge.runtime import load


def genai_generate(model, ids: list[int], n: int) -> tuple[list[int], float]:
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + n, min_length=len(ids) + n)
    t = time.perf_counter()
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([ids], dtype=np.int32))
    out = []
    while len(out) < n and not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out, time.perf_counter() - t


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("genai_dir")
    parser.add_argument("bundle")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--target-rows", default="auto", choices=["auto", "1", "2"],
                        help="specedge's single target steps (see `specedge generate --help`)")
    args = parser.parse_args(argv)
    n = args.max_new_tokens
    config = og.Config(args.genai_dir)
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": args.threads, "inter_op_num_threads": 1}}}}))
    model, gen = og.Model(config), load(args.bundle, threads=args.threads, prompt_cache=False,
                                      target_rows=args.target_rows if args.target_rows == "auto" else int(args.target_rows))
    print(f"intra-op threads: {args.threads} for both; specedge's target single steps as {gen.target_min_rows} "
          f"row(s), {'exact' if gen.target_steps_exact else 'NOT exact'} against its verify rows here", file=sys.stderr)
    prompts = [gen.encode(row["prompt"], row.get("chat", False)) for row in BUILTIN_PROMPTS]
    genai_generate(model, prompts[0], 8)                                    # warm-up, excluded
    gen.generate_ids(prompts[0], max_new_tokens=8, use_draft=False)
    race("onnxruntime-genai", lambda ids, count: genai_generate(model, ids, count), gen, prompts, n, args.repeat)


if __name__ == "__main__":
    main(sys.argv[1:])
