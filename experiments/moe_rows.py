"""onnxruntime's CPU MoE op (com.microsoft.MoE) on a toy layer: its error against numpy, and whether a token's row
is the same computed with others (7 rows at once) as alone: exact speculation needs the latter.

    python experiments/moe_rows.py

Also tries the layouts the op documents: a separate FC3 (gate, up apart) and non-interleaved SwiGLU.
"""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

E, H, I, K, N = 8, 32, 24, 2, 7                 # experts, hidden, intermediate, top-k, rows
rng = np.random.default_rng(0)
gate_w, up_w = (rng.standard_normal((E, I, H), dtype=np.float32) * 0.3 for _ in range(2))
down_w = rng.standard_normal((E, H, I), dtype=np.float32) * 0.3
x = rng.standard_normal((N, H), dtype=np.float32)
router = rng.standard_normal((N, E), dtype=np.float32)


def reference(x, router):
    p = np.exp(router - router.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    top = np.argsort(-p, axis=-1, kind="stable")[:, :K]
    weight = np.take_along_axis(p, top, -1)
    weight /= weight.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for n in range(len(x)):
        for j, e in enumerate(top[n]):
            g, u = x[n] @ gate_w[e].T, x[n] @ up_w[e].T
            out[n] += weight[n, j] * ((g / (1 + np.exp(-g)) * u) @ down_w[e].T)
    return out


def session(fc1, fc3, **attrs):
    inits = [numpy_helper.from_array(np.ascontiguousarray(fc1), "fc1"), numpy_helper.from_array(down_w, "fc2")]
    inputs = ["x", "r", "fc1", "", "fc2"]
    if fc3 is not None:
        inits.append(numpy_helper.from_array(fc3, "fc3"))
        inputs += ["", "fc3"]
    node = helper.make_node("MoE", inputs, ["y"], domain="com.microsoft", k=K, normalize_routing_weights=1, **attrs)
    graph = helper.make_graph([node], "moe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", H]),
                                              helper.make_tensor_value_info("r", TensorProto.FLOAT, ["n", E])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", H])], inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


interleaved = np.empty((E, 2 * I, H), np.float32)
interleaved[:, 0::2], interleaved[:, 1::2] = gate_w, up_w
swiglu = dict(activation_type="swiglu", activation_alpha=1.0, activation_beta=0.0)
layouts = {"interleaved SwiGLU": (interleaved, None, dict(swiglu, swiglu_fusion=1)),
           "gate|up SwiGLU": (np.concatenate([gate_w, up_w], 1), None, dict(swiglu, swiglu_fusion=2)),
           "separate FC3": (gate_w, up_w, dict(activation_type="silu"))}
for name, (fc1, fc3, attrs) in layouts.items():
    try:
        run = session(fc1, fc3, **attrs).run
        together = run(None, {"x": x, "r": router})[0]
        alone = np.stack([run(None, {"x": x[i:i + 1], "r": router[i:i + 1]})[0][0] for i in range(N)])
        print(f"{name}: max error against numpy {np.abs(together - reference(x, router)).max():.2e}, "
              f"rows alone equal rows together: {np.array_equal(alone, together)}")
    except Exception as err:  # noqa: BLE001 - what the op refuses is the finding
        print(f"{name}: refused: {str(err).splitlines()[0][:160]}")
