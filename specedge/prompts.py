"""Built-in prompts: what bench runs by default, the demo shows, and export checks a quantized model on."""

BUILTIN_PROMPTS = [
    {"prompt": "def quicksort(arr):\n"},
    {"prompt": "import numpy as np\n\ndef moving_average(x: np.ndarray, window: int) -> np.ndarray:\n"},
    {"prompt": "class LRUCache:\n    def __init__(self, capacity: int):\n"},
    {"prompt": "Rename the variable `total` to `acc` in this function and return the whole function:\n\n"
               "def sum_positive(values):\n    total = 0\n    for v in values:\n        if v > 0:\n"
               "            total += v\n    return total\n", "chat": True},
]
