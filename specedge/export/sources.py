"""Source models: a Hugging Face folder, a hub id, or a GGUF file, all understood through transformers.

transformers reads the config and tokenizer, builds the model the graph is checked against
(reference_model.py) and, where the weights cannot be read a tensor at a time (source_weights.py), loads
them (safetensors, .bin, sharding, GGUF dequantization and llama's GGUF q/k permutation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specedge.errors import ExportError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# buffers older checkpoints saved, which the model computes (transformers ignores them when loading)
_COMPUTED_BUFFER = re.compile(r"(rotary_emb\.inv_freq|\.attn\.(masked_)?bias|position_ids)$")


@dataclass
class Source:
    description: str       # what the user gave, for the manifest
    kind: str              # "hf-folder" | "hub" | "gguf"
    where: str             # folder or hub id for from_pretrained
    extra: dict            # more from_pretrained kwargs (gguf_file)
    config: dict
    tokenizer: object      # transformers tokenizer (fast)
    text_of: str = ""      # the multimodal architecture whose language model this source is ("": none)
    config_object: object = None        # transformers' config (of the language model for a multimodal source)

    def load_model(self):
        """-> transformers PreTrainedModel, float32, eval mode (sources that cannot be read a tensor at a time)."""
        import torch
        import transformers

        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()      # its load report: what it says is checked below, in one line
        try:    # float32: "auto" takes config.dtype, which would round wider stored tensors (or a GGUF's values)
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                self.where, dtype=torch.float32, output_loading_info=True, **self.extra)
        except Exception as err:  # noqa: BLE001 - a corrupt file or a shape mismatch raises whatever its library raises
            why = _first_line(err)
            if "ignore_mismatched_sizes" in why:         # transformers' advice is about its own API, not this tool
                why = "a tensor's shape is not the one config.json describes (do config and weights belong together?)"
            raise ExportError(f"cannot load weights of {self.description}: {why}") from err
        finally:
            transformers.logging.set_verbosity(verbosity)
        # transformers fills what the checkpoint lacks with random values and says so in a log: a bundle of those
        # would pass its own check (the reference is the same filled model), so a missing tensor is an error
        missing = sorted(info.get("missing_keys") or ()) + sorted(info.get("mismatched_keys") or ())
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise ExportError(f"cannot load weights of {self.description}: the checkpoint lacks (or has the wrong "
                              f"shape for) {', '.join(map(str, missing[:3]))}{more}; nothing was written")
        # and tensors the model does not have (a config of fewer layers than its weights) would export a model cut
        # down without a word, which passes its check too; old checkpoints' computed buffers are no such tensors
        # (a GGUF file's tensors are named by transformers' map, which leaves out what it does not use)
        extra = [] if self.kind == "gguf" else \
            sorted(k for k in info.get("unexpected_keys") or () if not _COMPUTED_BUFFER.search(k))
        if extra:
            more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
            raise ExportError(f"cannot load weights of {self.description}: the checkpoint holds {', '.join(extra[:3])}"
                              f"{more}, which the model config.json describes has no place for (do config and "
                              "weights belong together?); nothing was written")
        return _language_model(model) if self.text_of else model.eval()

    def generation_config(self):
        """What transformers' from_pretrained gives the model (its eos ids): generation_config.json, else the
        generation settings of config.json (the whole config's, for an image-and-text source); a GGUF's from its
        config."""
        import transformers

        if self.kind == "gguf":
            return transformers.GenerationConfig.from_model_config(self.config_object)
        try:
            try:
                return transformers.GenerationConfig.from_pretrained(self.where, **self.extra)
            except OSError:
                return transformers.GenerationConfig.from_pretrained(
                    self.where, config_file_name="config.json", _from_model_config=True, **self.extra)
        except Exception as err:  # noqa: BLE001 - an invalid file raises whatever its parser raises
            raise ExportError(f"cannot read the generation config of {self.description}: {_first_line(err)}") from err

    def eos_token_ids(self) -> tuple[list[int], list[str]]:
        """-> (every id generation stops at, the end-of-turn tokens among them that the source does not declare)"""
        return _eos_ids(self.generation_config(), self.config, self.tokenizer)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _locate(src: str) -> tuple[str, str, dict]:
    """-> (kind, folder or hub id, extra from_pretrained kwargs)"""
    path = Path(src).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ExportError(f"{src}: a model file must be .gguf (or give a Hugging Face folder)")
        return "gguf", str(path.parent), {"gguf_file": path.name}
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ExportError(f"{src}: folder has no config.json (not a Hugging Face model folder)")
        return "hf-folder", str(path), {}
    if _HUB_ID.match(src):
        org = Path(src.split("/")[0])
        if org.is_dir():            # "models/qwen-typo" beside a models/ folder: a mistyped path, not a hub id
            raise ExportError(f"{src}: no such file or folder in {org}/ (a hub id has the same org/name form, but "
                              f"{org}/ is a folder here; to download it anyway, run from another folder)")
        return "hub", src, {}
    raise ExportError(f"{src}: no such file or folder, and not a hub id of the form org/name")


def open_source(src: str) -> Source:
    """Reads config and tokenizer (cheap); the weights come later (source_weights.open_weights)."""
    import transformers

    kind, where, extra = _locate(src)
    if kind == "hub":
        _reachable_hub(src)
    try:
        config = transformers.AutoConfig.from_pretrained(where, **extra)
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, **extra)
    except Exception as err:  # noqa: BLE001 - a corrupt file or config raises whatever its parser raises
        hint = " (the hub needs a network connection)" if kind == "hub" else ""
        raise ExportError(f"cannot load {src}{hint}: {_first_line(err)}") from err
    cfg = config.to_dict()
    rows = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    if isinstance(rows, int) and len(tokenizer) < rows // 2:
        # transformers builds a tokenizer of a token or two from config.json alone when the files are missing: a
        # bundle with it exports, then cannot encode a prompt
        raise ExportError(f"{src}: its tokenizer has {len(tokenizer)} tokens for {rows} embedding rows; is the "
                          "folder missing its tokenizer files (tokenizer.json, tokenizer_config.json)?")
    if not cfg.get("architectures"):
        mapping = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        name = mapping.get(cfg.get("model_type"))
        cfg["architectures"] = [name] if name else []
    cfg, text_of = _text_config(cfg)
    if text_of:
        config = config.text_config
        config.tie_word_embeddings = cfg["tie_word_embeddings"]    # the whole model's setting (_text_config)
    dropped = [name for name in cfg["architectures"]
               if name.startswith("Gemma") or name in ("Phi3ForCausalLM", "Starcoder2ForCausalLM")]
    if kind == "gguf" and dropped:
        # transformers' GGUF reader leaves out Gemma 3's rope scaling (4B and up) and the 27B models' query scale,
        # Phi-3's LongRoPE factors, partial rotary dims and sliding window, StarCoder2's rope theta: the export check
        # would compare with the same wrong model
        raise ExportError(f"{src}: {dropped[0]} from a GGUF file is not supported (transformers' GGUF reader drops "
                          "some of its settings); export it from its Hugging Face folder")
    return Source(src, kind, where, extra, cfg, tokenizer, text_of, config)


def _reachable_hub(src: str) -> None:
    """A hub id needs the hub: without a network huggingface_hub retries for ~25 s before failing, so a connection
    is tried first (3 s). Offline mode (HF_HUB_OFFLINE=1: the local cache only) skips it."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:                  # huggingface_hub's own reading of HF_HUB_OFFLINE
        return
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as err:
        raise ExportError(f"{src}: cannot reach {host} for this hub id ({err.strerror or err}); a model already in the "
                          "Hugging Face cache exports with HF_HUB_OFFLINE=1") from None


# image-and-text checkpoints whose language model exports alone: architecture -> that model's architecture
MULTIMODAL = {"Gemma3ForConditionalGeneration": "Gemma3ForCausalLM"}


def _text_config(cfg: dict) -> tuple[dict, str]:
    """A multimodal config -> (its language model's config, the multimodal architecture); others unchanged."""
    found = [name for name in cfg["architectures"] if name in MULTIMODAL]
    if not found:
        return cfg, ""
    text = {**cfg["text_config"], "architectures": [MULTIMODAL[found[0]]]}
    for key in ("eos_token_id", "tie_word_embeddings"):         # set on the whole model, not its text part
        text[key] = cfg.get(key, text.get(key))
    return text, found[0]


def _language_model(model):
    """Gemma 3's image-and-text model -> a Gemma3ForCausalLM sharing its language model and head: the same logits
    for text (the image tokens' bidirectional attention never applies), the weight names of the text-only one."""
    import torch
    import transformers

    with torch.device("meta"):                  # no weights of its own: it takes the loaded model's
        text = transformers.Gemma3ForCausalLM(model.config.text_config)
    text.model, text.lm_head = model.model.language_model, model.lm_head
    text.generation_config = model.generation_config
    return text.eval()


def _eos_ids(generation, cfg: dict, tokenizer) -> tuple[list[int], list[str]]:
    found: list[int] = []
    added: list[str] = []
    for value in (getattr(generation, "eos_token_id", None), cfg.get("eos_token_id"), tokenizer.eos_token_id):
        for tid in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(tid, int) and tid not in found:
                found.append(tid)
    # Chat models end turns with a token that not every config lists as eos; only where it is a special token:
    # in Qwen2.5's vocabulary "</s>" is plain text (id 128247, an HTML tag's end), and stopping there cut code
    special = set(tokenizer.all_special_tokens) | {
        t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", False)}
    for text in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>", "</s>"):
        tid = tokenizer.convert_tokens_to_ids(text) if text in special else None
        if isinstance(tid, int) and tid not in found:
            found.append(tid)
            added.append(f"{text} ({tid})")
    return found, added
