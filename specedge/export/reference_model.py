"""transformers' own model of the source as the export check's reference, without holding its weights.

The model is built with its parameters on the meta device (its buffers, such as rope frequencies, real). While a
module runs, its own parameters are float32 tensors read from the source (or the dequantized values a quantized
graph multiplies with), dropped again when it returns: the forward pass holds one module's weights at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import numpy as np

Overrides = dict[str, Callable[[], object]]     # parameter name -> () -> float32 tensor used instead of the source's


def skeleton(source):
    """The source's transformers model, float32, parameters on meta, tied parameters tied, eval mode."""
    import torch
    import transformers
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = transformers.AutoModelForCausalLM.from_config(source.config_object, dtype=torch.float32)
    model.tie_weights()
    return model.eval()


def long_rope_everywhere(model) -> None:
    """LongRoPE's long factors at every position in the reference, as a bundle longer than the original length has
    them; transformers' own model takes them only for a sequence longer than that."""
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    changed = 0
    for module in model.modules():
        if getattr(module, "rope_type", None) == "longrope" and hasattr(module, "original_inv_freq"):
            original = module.config.rope_parameters["original_max_position_embeddings"]
            long_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](module.config, None, seq_len=original + 1)
            with torch.no_grad():
                module.original_inv_freq.copy_(long_freq)
                module.inv_freq.copy_(long_freq)
            changed += 1
    if not changed:
        raise RuntimeError("the reference model has no LongRoPE embedding to switch to its long factors")


@contextmanager
def weights_while_running(model, weights, overrides: Overrides | None = None):
    """Within it, each module of `model` runs with its own parameters read from `weights` (SourceWeights), or from
    `overrides`, and gives them back afterwards."""
    import torch

    if getattr(model, "_specedge_lending", False):       # a second set of hooks would hand back the wrong tensors
        raise RuntimeError("weights_while_running is already active on this model")
    overrides = overrides or {}
    handles, lent = [], {}                                # module -> a stack of what it had (a module may recurse)

    def lend(module, _args):
        own = dict(module._parameters)
        lent.setdefault(module, []).append(own)
        for key, param in own.items():
            if param is not None:
                name = f"{module.qualified_name}.{key}" if module.qualified_name else key
                value = overrides[name]() if name in overrides else weights.tensor(name)
                module._parameters[key] = torch.nn.Parameter(value, requires_grad=False)

    def give_back(module, _args, _output):
        module._parameters.update(lent[module].pop())

    model._specedge_lending = True
    try:
        for name, module in model.named_modules():
            if any(p is not None for p in module._parameters.values()):
                module.qualified_name = name
                handles += [module.register_forward_pre_hook(lend), module.register_forward_hook(give_back)]
        yield model
    finally:
        for handle in handles:
            handle.remove()
        for module, stack in lent.items():               # a forward that raised leaves its modules' weights lent
            if stack:
                module._parameters.update(stack[0])
        model._specedge_lending = False


def logits(model, weights, rows: list[list[int]], vocab_size: int,
           overrides: Overrides | None = None) -> list[np.ndarray]:
    """The model's logits over each row of ids, teacher-forced, a pass per row -> [len(row), vocab_size] float32 each.
    Not one padded batch: attention's kernels depend on the sequence length, so padding changes the last bits, and
    these logits are what the graph's are measured against."""
    import torch

    with torch.no_grad(), weights_while_running(model, weights, overrides):
        return [model(input_ids=torch.tensor([row]), use_cache=False).logits[0, :, :vocab_size].float().numpy()
                for row in rows]
