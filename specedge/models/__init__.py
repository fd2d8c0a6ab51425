"""Architecture registry, keyed by the HF `architectures` name.

Each entry turns a config dict into a ModelSpec and writes the decoder body into a StepGraph from an
explicit weight-name map.
"""

from __future__ import annotations

from types import ModuleType

from specedge.errors import ExportError
from specedge.models import gemma, gpt2, llama, starcoder2

ARCHITECTURES: dict[str, ModuleType] = {
    "LlamaForCausalLM": llama,
    "MistralForCausalLM": llama,
    "Qwen2ForCausalLM": llama,
    "Qwen3ForCausalLM": llama,
    "Phi3ForCausalLM": llama,
    "GraniteForCausalLM": llama,
    "Olmo2ForCausalLM": llama,
    "Olmo3ForCausalLM": llama,
    "SmolLM3ForCausalLM": llama,
    "Exaone4ForCausalLM": llama,
    "HunYuanDenseV1ForCausalLM": llama,
    "GPT2LMHeadModel": gpt2,
    "Starcoder2ForCausalLM": starcoder2,
    "GemmaForCausalLM": gemma,
    "Gemma2ForCausalLM": gemma,
    "Gemma3ForCausalLM": gemma,
}


def architecture_of(cfg: dict) -> tuple[str, ModuleType]:
    names = cfg.get("architectures") or []
    for name in names:
        if name in ARCHITECTURES:
            return name, ARCHITECTURES[name]
    shown = ", ".join(names) or f"model_type '{cfg.get('model_type')}'"
    raise ExportError(f"unsupported architecture {shown}; supported: {', '.join(ARCHITECTURES)}")
