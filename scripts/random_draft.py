"""Writes a useless draft: a random 1-layer Qwen2 with a bundle's vocabulary (for worst-case benchmarks).

    python scripts/random_draft.py BUNDLE OUT_FOLDER
    specedge export --target TARGET_SRC --draft OUT_FOLDER --out USELESS_BUNDLE
"""

import json
import sys
from pathlib import Path

import torch
import transformers


def main(bundle: str, out: str) -> None:
    manifest = json.loads((Path(bundle) / "manifest.json").read_text())
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(Path(bundle) / manifest["tokenizer"]["file"]))
    tok.eos_token = manifest["tokenizer"]["eos_token"]
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=manifest["vocab_size"], hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=manifest["max_seq_len"], tie_word_embeddings=True)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
