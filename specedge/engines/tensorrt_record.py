"""The manifest's engines["tensorrt"] record, its optimization profiles, and whether it fits this machine.

Written by `specedge build BUNDLE --tensorrt` (tensorrt_build.py), read by the tensorrt backend. No tensorrt
import here: the record is checked, and profiles are chosen, on any machine.

manifest["engines"]["tensorrt"] = {
  "record_version": 1, "experimental": true (not yet run on a GPU),
  "tensorrt_version": "10.15.1.29"     trt.__version__ of the builder: a runtime of another version is refused
  "cuda_version": "12.9", "cuda_driver_version": "13.0"     cudaRuntimeGetVersion / cudaDriverGetVersion
  "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0"}    the device the engines were built on
  "hardware_compatibility_level": "none" | "same_compute_capability" | "ampere_plus"   (trt.HardwareCompatibilityLevel)
  "strongly_typed": true               types come from the graph (the bundle's dtype), not from builder flags
  "max_batch": N, "max_step": 64       the largest call the profiles cover: N rows of max_step tokens
  "graph_rewrites": [...]              what the builder normalized before parsing (trt_ops.normalize_for_tensorrt)
  "built": ISO time, "specedge_version"
  "models": {ROLE: {"onnx": "target.onnx", "onnx_sha256",          the step graph it was built from
                    "file": "engines/tensorrt-<id>/target.plan", "bytes", "sha256",   (also listed in "files")
                    "profiles": [PROFILE, ...]}}                   in the engine's profile order
}
PROFILE = {"name", "batch": [min, opt, max], "tokens": [min, opt, max], "logit_rows": [min, opt, max]}
  batch = rows B of a call; tokens = T (input_ids, position_ids [B, T]); logit_rows = n (logit_rows [B, n]); the
  KV inputs [B, H_kv, slots, D] share B. A call runs in the first profile (in order) whose ranges hold its (B, T, n).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from specedge.errors import BundleError, OptionError
from specedge.runtime.backends.base import decode_width as base_decode_width

RECORD_VERSION = 1
LEVELS = {"none": "NONE", "same_compute_capability": "SAME_COMPUTE_CAPABILITY", "ampere_plus": "AMPERE_PLUS"}
LEVEL_OPTIONS = {"none": "none", "same-compute-capability": "same_compute_capability", "ampere-plus": "ampere_plus"}
SYMBOLS = {"batch": "batch", "step": "tokens", "logit_rows": "logit_rows"}     # manifest io dim name -> range
REBUILD = "specedge build {bundle} --tensorrt"


@dataclass(frozen=True)
class Profile:
    name: str
    batch: tuple[int, int, int]
    tokens: tuple[int, int, int]
    logit_rows: tuple[int, int, int]

    def __post_init__(self):
        for field in ("batch", "tokens", "logit_rows"):
            lo, opt, hi = getattr(self, field)
            if not 1 <= lo <= opt <= hi:
                raise OptionError(f"profile {self.name}: {field} needs 1 <= min <= opt <= max, got {lo}, {opt}, {hi}")

    def fits(self, b: int, t: int, n: int) -> bool:
        return all(lo <= v <= hi for v, (lo, _, hi) in zip((b, t, n), (self.batch, self.tokens, self.logit_rows)))

    def shapes(self, inputs: dict) -> dict[str, tuple[tuple, tuple, tuple]]:
        """{input name: (min shape, opt shape, max shape)} for the manifest's io inputs {name: {"shape": [...]}}:
        named dims from the profile's ranges, numbers as they are."""
        out = {}
        for name, tensor in inputs.items():
            dims = []
            for dim in tensor["shape"]:
                if isinstance(dim, int):
                    dims.append((dim, dim, dim))
                elif dim in SYMBOLS:
                    dims.append(getattr(self, SYMBOLS[dim]))
                else:
                    raise BundleError(f"input {name} has a dimension '{dim}' that no profile sets")
            out[name] = tuple(tuple(d[i] for d in dims) for i in range(3))
        return out

    def to_json(self) -> dict:
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()}

    @classmethod
    def from_json(cls, record: dict) -> "Profile":
        return cls(record["name"], *(tuple(record[k]) for k in ("batch", "tokens", "logit_rows")))


def max_step(manifest: dict, prefill_chunk: int) -> int:
    """The longest call the runtime makes (generator.py: a prefill chunk, or a draft catch-up of max_draft + 2)."""
    return max(prefill_chunk, manifest["max_draft"] + 2)


def decode_width(manifest: dict, role: str) -> int:
    """Tokens a row of every decode call carries on GPU backends (backends/base.py)."""
    return base_decode_width(manifest["max_draft"], role)


def default_profiles(manifest: dict, role: str, max_batch: int, prefill_chunk: int) -> list[Profile]:
    """decode: every row of a decode call (B = max_batch at the fixed width, the shape tuned for and captured as a
    CUDA graph), verify and catch-up calls up to max_draft + 2 tokens; prefill: one sequence's prompt chunk, up to
    max_step tokens, one logit row (any B, so a batch of joining sequences fits too)."""
    width, short, step = decode_width(manifest, role), manifest["max_draft"] + 2, max_step(manifest, prefill_chunk)
    profiles = [Profile("decode", (1, max_batch, max_batch), (1, width, short), (1, width, short))]
    if step > short:
        profiles.append(Profile("prefill", (1, 1, max_batch), (1, min(prefill_chunk, step), step), (1, 1, step)))
    return profiles


def parse_profiles(text: str | None, manifest: dict, role: str, max_batch: int, prefill_chunk: int) -> list[Profile]:
    """--profiles: comma-separated presets (decode, prefill) or NAME:TMIN-TMAX[@TOPT] (tokens per row; batch
    1..max_batch; logit rows 1..TMAX, tuned for TOPT rows when TOPT <= max_draft + 1, else for one: a prefill-like
    call). None: the defaults. The profiles must cover every call shape the runtime makes (checked)."""
    presets = {p.name: p for p in default_profiles(manifest, role, max_batch, prefill_chunk)}
    if not text:
        profiles = list(presets.values())
    else:
        profiles = []
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            if item in presets:
                profiles.append(presets[item])
                continue
            name, _, spec = item.partition(":")
            try:
                span, _, opt = spec.partition("@")
                lo, _, hi = span.partition("-")
                lo, hi = int(lo), int(hi or lo)
                opt = int(opt) if opt else hi
            except ValueError:
                raise OptionError(f"--profiles: '{item}' is neither a preset ({', '.join(presets)}) nor "
                                  "NAME:TMIN-TMAX[@TOPT]") from None
            rows = opt if opt <= manifest["max_draft"] + 1 else 1
            profiles.append(Profile(name or f"profile{len(profiles)}", (1, max_batch, max_batch), (lo, opt, hi),
                                    (1, min(rows, hi), hi)))
    names = [p.name for p in profiles]
    if len(set(names)) != len(names) or not profiles:
        raise OptionError(f"--profiles: needs at least one profile, each name once (got {', '.join(names) or 'none'})")
    gaps = coverage_gaps(profiles, max_batch, max_step(manifest, prefill_chunk))
    if gaps:
        raise OptionError(f"--profiles leave calls the runtime makes without a profile ({gaps}); the runtime needs "
                          f"1..{max_step(manifest, prefill_chunk)} tokens and 1..{max_batch} rows")
    return profiles


def coverage_gaps(profiles: list[Profile], max_batch: int, step: int) -> str:
    """'' if every call (B <= max_batch rows, T <= step tokens, n <= T logit rows: pad_call never asks for more rows
    than tokens) fits a profile, else the first few that do not, as 'B=.., T=.., n=..'."""
    missing = []
    for t in range(1, step + 1):
        for n in range(1, t + 1):
            for b in range(1, max_batch + 1):
                if not any(p.fits(b, t, n) for p in profiles):
                    missing.append(f"B={b}, T={t}, n={n}")
    return "; ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")


def select_profile(profiles: list[Profile], b: int, t: int, n: int) -> int:
    """The index of the first profile that holds a call of b rows, t tokens and n logit rows."""
    for index, profile in enumerate(profiles):
        if profile.fits(b, t, n):
            return index
    raise OptionError(f"no TensorRT optimization profile holds a call of {b} rows x {t} tokens ({n} logit rows); "
                      f"profiles: {', '.join(f'{p.name} B{p.batch[0]}-{p.batch[2]} T{p.tokens[0]}-{p.tokens[2]}' for p in profiles)}")


def compatibility_problem(record: dict, here: dict, bundle: str = "BUNDLE") -> str | None:
    """Why engines described by `record` cannot run here (None if they can). here = {"tensorrt_version",
    "gpu": {"name", "compute_capability"}}. TensorRT plans load only into the TensorRT version that built them
    (without version-compatible builds, which these are not); on the GPU, by hardware-compatibility level: none ->
    the same GPU model (name and compute capability), same_compute_capability -> the same compute capability,
    ampere_plus -> compute capability 8.0 or newer."""
    built_gpu, gpu = record["gpu"], here["gpu"]
    level = record.get("hardware_compatibility_level", "none")
    differs = []
    if record["tensorrt_version"] != here["tensorrt_version"]:
        differs.append(f"TensorRT {record['tensorrt_version']} built them, this machine has {here['tensorrt_version']}")
    cc_built, cc_here = _cc(built_gpu["compute_capability"]), _cc(gpu["compute_capability"])
    if level == "ampere_plus":
        if cc_here < (8, 0):
            differs.append(f"they need an Ampere or newer GPU (hardware compatibility ampere_plus), this machine has "
                           f"{gpu['name']} (compute capability {gpu['compute_capability']})")
    elif level == "same_compute_capability":
        if cc_built != cc_here:
            differs.append(f"they were built for compute capability {built_gpu['compute_capability']} "
                           f"({built_gpu['name']}), this machine has {gpu['name']} ({gpu['compute_capability']})")
    elif level == "none":
        if built_gpu["name"] != gpu["name"] or cc_built != cc_here:
            differs.append(f"they were built for {built_gpu['name']} (compute capability "
                           f"{built_gpu['compute_capability']}), this machine has {gpu['name']} "
                           f"(compute capability {gpu['compute_capability']})")
    else:
        differs.append(f"unknown hardware compatibility level '{level}'")
    if not differs:
        return None
    return (f"the bundle's TensorRT engines do not fit this machine: {'; '.join(differs)}. Rebuild them here: "
            f"{REBUILD.format(bundle=bundle)} (add --hardware-compatibility same-compute-capability or ampere-plus to "
            "build engines that other GPUs can load)")


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


def model_record(record: dict, onnx_file: str) -> tuple[str, dict]:
    """-> (role, the record's model entry) of the engine built from the step graph `onnx_file`."""
    for role, model in record.get("models", {}).items():
        if model.get("onnx") == onnx_file:
            return role, model
    raise BundleError(f"the bundle's TensorRT engines include none built from {onnx_file}; rebuild them: "
                      f"{REBUILD.format(bundle='BUNDLE')}")


def check_record(record: dict) -> None:
    """The record's own shape (a hand-edited or truncated manifest fails here, not deep in the backend)."""
    if not isinstance(record, dict) or record.get("record_version") != RECORD_VERSION:
        raise BundleError(f"unknown TensorRT engine record (version {record.get('record_version') if isinstance(record, dict) else '?'}, "
                          f"this specedge reads {RECORD_VERSION}); rebuild: {REBUILD.format(bundle='BUNDLE')}")
    for key in ("tensorrt_version", "gpu", "hardware_compatibility_level", "max_batch", "max_step", "models"):
        if key not in record:
            raise BundleError(f"the TensorRT engine record lacks '{key}'; rebuild: {REBUILD.format(bundle='BUNDLE')}")
