"""A GGUF file dequantized to a plain fp32 Hugging Face folder, for tools that read only those (the
onnxruntime-genai builder in scripts/compare_genai.py). Dev only: needs torch, transformers and gguf.

    python scripts/gguf_to_hf.py MODEL.gguf OUT_FOLDER
"""

import sys
from pathlib import Path

import torch
import transformers


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        sys.exit("usage: python scripts/gguf_to_hf.py MODEL.gguf OUT_FOLDER")
    gguf, out = Path(argv[0]), argv[1]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                              dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # transformers marks GGUF-loaded models unserializable; the weights are plain fp32 tensors by now
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
