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


@contextmanager
def weights_while_running(model, weights, overrides: Overrides | None = None):
    """Within it, each module of `model` runs with its own parameters read from `weights` (SourceWeights), or from
    `overrides`, and gives them back afterwards."""
    import torch

    overrides = overrides or {}
    handles, lent = [], {}

    def lend(module, _args):
        lent[module] = dict(module._parameters)
        for key, param in lent[module].items():
            if param is not None:
                name = f"{module.qualified_name}.{key}" if module.qualified_name else key
                value = overrides[name]() if name in overrides else weights.tensor(name)
                module._parameters[key] = torch.nn.Parameter(value, requires_grad=False)

    def give_back(module, _args, _output):
        module._parameters.update(lent.pop(module))

    try:
        for name, module in model.named_modules():
            if any(p is not None for p in module._parameters.values()):
                module.qualified_name = name
                handles += [module.register_forward_pre_hook(lend), module.register_forward_hook(give_back)]
        yield model
    finally:
        for handle in handles:
            handle.remove()
        for module, params in lent.items():          # a forward that raised leaves its modules' weights lent
            module._parameters.update(params)


def logits(model, weights, rows: list[list[int]], vocab_size: int, overrides: Overrides | None = None) -> list[np.ndarray]:
    """The model's logits over each row of ids, teacher-forced, in one forward pass -> [len(row), vocab_size]
    float32 per row. Rows of different lengths are right-padded: a causal model's logits at a position do not
    depend on what follows it."""
    import torch

    width = max(len(row) for row in rows)
    ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    mask = None
    if any(len(row) < width for row in rows):
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    with torch.no_grad(), weights_while_running(model, weights, overrides):
        out = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :, :vocab_size].float().numpy()
    return [out[i, : len(row)] for i, row in enumerate(rows)]
