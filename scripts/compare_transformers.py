"""Plain target-only decoding: specedge against Hugging Face transformers on the same weights, in one process.

    python scripts/gguf_to_hf.py MODEL.gguf HF_FOLDER         # the weights specedge exports, as fp32
    python scripts/compare_transformers.py HF_FOLDER BUNDLE [--max-new-tokens 64] [--repeat 1]

Greedy, the built-in bench prompts with specedge's token ids for both, exactly --max-new-tokens new
tokens each (eos ignored), the two alternating per prompt; torch gets the same thread count as
onnxruntime (--threads, default all logical CPUs). Dev only: needs torch and transformers.
"""

import argparse
import os
import sys
import time

import torch
import transformers

from plain_decode_race import race
from specedge.prompts import BUILTIN_PROMPTS
from specedge.runtime import load


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("hf_folder")
    parser.add_argument("bundle")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.hf_folder, dtype=torch.float32).eval()
    gen = load(args.bundle, threads=args.threads, prompt_cache=False)
    n = args.max_new_tokens
    prompts = [gen.encode(row["prompt"], row.get("chat", False)) for row in BUILTIN_PROMPTS]

    def hf_generate(ids: list[int], count: int) -> tuple[list[int], float]:
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, max_new_tokens=count, min_new_tokens=count, pad_token_id=0)
        return out[0, len(ids):].tolist(), time.perf_counter() - start

    hf_generate(prompts[0], 4)                                             # warm-up, excluded
    gen.generate_ids(prompts[0], max_new_tokens=4, use_draft=False)
    race("transformers", hf_generate, gen, prompts, n, args.repeat)
    print(f"threads {args.threads}")


if __name__ == "__main__":
    main(sys.argv[1:])
