"""The engine behind `specedge serve`: a bundle loaded with the serve options into a batched Generator (a
background worker), and the Limits its routes enforce. One function, so that the local server (cli.py) and
every Ray Serve replica (ray_app.py) serve exactly the same thing from the same options."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from specedge.serve.protocol import Limits

log = logging.getLogger("specedge.serve")


@dataclass(frozen=True)
class EngineConfig:
    """`specedge serve`'s engine options; plain values, so that Ray can send them to each replica."""
    bundle: str
    max_batch: int | None = None          # None: 8 for a bundle exported with --attention standard, else 1
    max_queue: int = 64
    served_model_name: str | None = None  # None: the bundle folder's name
    policy: str | None = None             # None: adaptive, or target for a bundle without a draft; "off" = target
    drafter: str = "model"
    request_timeout: float = 600.0
    threads: int | None = None
    backend: str = "cpu"
    device_id: int = 0
    cuda_graphs: bool = True
    target_rows: str | int = "auto"
    prompt_cache: bool | None = None      # free slots keep their text (None: where exact; see runtime.load)
    reasoning: bool = True                # thinking (<think>...</think>) as reasoning_content where the template has it
    stored_responses: int = 256           # the Responses API's kept responses (0: none)

    def resolved_max_batch(self) -> int:
        """The KV slots a replica allocates (reads the manifest when max_batch is unset)."""
        if self.max_batch is not None:
            return self.max_batch
        from specedge.runtime.manifest import read_manifest

        return 8 if read_manifest(self.bundle)["models"]["target"].get("max_batch") is None else 1

    @property
    def model_name(self) -> str:
        # the folder's name as typed (a symlink's own, not its target's); abspath only so that "." has a name
        return self.served_model_name or Path(os.path.abspath(self.bundle)).name


def load_engine(config: EngineConfig):
    """-> (Generator loaded with background=True, Limits). A bad default policy is a one-line OptionError here,
    at start, not at the first request."""
    from specedge.runtime import load

    max_batch = config.resolved_max_batch()
    if config.max_batch is None and max_batch == 1:
        log.warning("this bundle runs one sequence per call (exported with the default --attention gqa): requests "
                    "are served one at a time; export with --attention standard to batch them")
    gen = load(config.bundle, backend=config.backend, threads=config.threads, target_rows=config.target_rows,
               max_batch=max_batch, max_queue=config.max_queue, background=True,
               device_id=config.device_id, cuda_graphs=config.cuda_graphs, prompt_cache=config.prompt_cache)
    policy = config.policy
    if policy is None:
        policy = "adaptive" if gen.draft is not None or config.drafter == "ngram" else "target"
    policy = "target" if policy == "off" else policy
    try:
        gen.options(policy=policy, drafter=config.drafter)
    except Exception:
        gen.close()
        raise
    limits = Limits(model=config.model_name, policy=policy, drafter=config.drafter,
                    request_timeout=config.request_timeout, reasoning=config.reasoning,
                    stored_responses=config.stored_responses)
    return gen, limits
