"""`specedge serve --ray`: the same engine as a Ray Serve application (the `ray` extra: pip install 'specedge[ray]').

Each replica loads the bundle into its own batched Generator (engine.py) and serves the Starlette app of app.py
unchanged; Ray Serve's HTTP proxy puts the replicas behind one route and sends each request to a less loaded one.
Ray starts, places, health-checks, restarts and scales the replicas: there is no cluster code here.

    specedge serve BUNDLE --ray --replicas 2 [--ray-address ADDR]           (cli.py -> application(), run())
    serve run specedge.serve.ray_app:build bundle=BUNDLE replicas=2          (Ray's own CLI -> build())

This module imports ray at the top: only cli.py's --ray path (lazily) and Ray itself import it, never the runtime.
No `from __future__ import annotations`: Ray reads build()'s annotation as a class to validate its arguments.
"""

import logging
import os
import re
import signal
import threading
from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator
from ray import serve

from specedge.errors import SpecedgeError
from specedge.serve.app import DEFAULT_MAX_BODY_BYTES, create_app
from specedge.serve.engine import EngineConfig, load_engine

APP_NAME = "specedge"                  # the Ray Serve application (one route, "/")
GPU_BACKENDS = ("cuda", "tensorrt")
CONSTRUCTOR_RETRIES = 3                # Ray's default (20) reloads a bundle that cannot load 20 times

log = logging.getLogger("specedge.serve")


@serve.deployment(name="SpecedgeReplica")
@serve.ingress()                       # the ASGI app comes per replica, from __serve_build_asgi_app__
class SpecedgeReplica:
    """One replica: its own engine (KV slots, worker thread, metrics), the app of app.py around it."""

    def __init__(self, config: EngineConfig, api_key=None, max_body_bytes=DEFAULT_MAX_BODY_BYTES,
                 log_level="info"):
        # a replica is a fresh process: without this its one-line request log would be dropped (Ray shows the
        # replica's stderr in its logs and on the driver)
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("specedge").setLevel(log_level.upper())
        self.replica = serve.get_replica_context().replica_tag
        self.gen, self.limits = load_engine(config)
        self.api_key, self.max_body_bytes = api_key, max_body_bytes
        log.info("replica %s: %s loaded (max batch %d, default policy %s)", self.replica, self.limits.model,
                 self.gen.max_batch, self.limits.policy)

    def __serve_build_asgi_app__(self):
        return create_app(self.gen, self.limits, api_key=self.api_key, max_body_bytes=self.max_body_bytes,
                          replica=self.replica)

    def __del__(self):
        # Ray calls this after the graceful shutdown (in-flight requests done) and the app's lifespan end
        gen = getattr(self, "gen", None)
        if gen is not None:
            gen.close()


def application(config: EngineConfig, replicas: int = 1, autoscale: tuple[int, int] | None = None,
                target_ongoing_requests: float | None = None, api_key: str | None = None,
                max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, drain_timeout: float = 30.0, log_level: str = "info",
                cpus_per_replica: float | None = None):
    """The Ray Serve application: `replicas` engines, or between autoscale=(min, max) of them.

    Each replica takes max_batch + max_queue requests at once (max_ongoing_requests): Ray routes by that
    count, so a full replica gets no more while another has room, and beyond every replica's capacity requests
    wait in Ray's proxy. Autoscaling aims at target_ongoing_requests per replica (default max_batch: scale up
    when the average replica's slots are all busy)."""
    try:
        max_batch = config.resolved_max_batch()
    except SpecedgeError as err:
        raise SpecedgeError(f"{err} (the default --max-batch comes from the bundle's manifest: give --max-batch "
                            "when the bundle is only on the cluster's nodes)") from None
    gpus = 1 if config.backend in GPU_BACKENDS else 0
    # decided once, here, for every replica: the batch size, the model id, an absolute path (a replica's
    # working directory is not ours); Ray shows a GPU replica only its own GPU, as device 0
    bundle = str(Path(config.bundle).resolve()) if Path(config.bundle).exists() else config.bundle
    config = replace(config, bundle=bundle, max_batch=max_batch, served_model_name=config.model_name,
                     device_id=0 if gpus else config.device_id)
    options = dict(max_ongoing_requests=max_batch + config.max_queue, graceful_shutdown_timeout_s=drain_timeout,
                   max_constructor_retry_count=CONSTRUCTOR_RETRIES,
                   ray_actor_options={"num_cpus": cpus_per_replica or config.threads or 1, "num_gpus": gpus})
    if autoscale is None:
        options["num_replicas"] = replicas
    else:
        low, high = autoscale
        options["autoscaling_config"] = {"min_replicas": low, "max_replicas": high,
                                         "target_ongoing_requests": target_ongoing_requests or max_batch}
    return SpecedgeReplica.options(**options).bind(config, api_key, max_body_bytes, log_level)


class BuildArgs(BaseModel):
    """The arguments of `serve run specedge.serve.ray_app:build key=value ...` (or `args:` in a Serve config
    file): `specedge serve`'s options, with underscores."""
    model_config = ConfigDict(extra="forbid")

    bundle: str
    replicas: int = Field(1, ge=1)
    min_replicas: int | None = Field(None, ge=0)
    max_replicas: int | None = Field(None, ge=1)
    target_ongoing_requests: float | None = Field(None, gt=0)
    max_batch: int | None = Field(None, ge=1)
    max_queue: int = Field(64, ge=0)
    served_model_name: str | None = None
    policy: str | None = None
    drafter: str = "model"
    request_timeout: float = Field(600.0, gt=0)
    drain_timeout: float = Field(30.0, ge=0)
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1)
    api_key: str | None = None
    threads: int | None = Field(None, ge=1)
    cpus_per_replica: float | None = Field(None, gt=0)
    backend: str = "cpu"
    target_rows: str = "auto"
    cuda_graphs: bool = True
    prompt_cache: bool | None = None
    stored_responses: int = Field(256, ge=0)
    log_level: str = "info"

    @model_validator(mode="after")
    def _autoscale_both(self):
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ValueError("give both min_replicas and max_replicas (autoscaling), or neither")
        return self


def build(args: BuildArgs):
    """Ray Serve's application builder (`serve run specedge.serve.ray_app:build bundle=PATH replicas=2`)."""
    config = EngineConfig(bundle=args.bundle, max_batch=args.max_batch, max_queue=args.max_queue,
                          served_model_name=args.served_model_name, policy=args.policy, drafter=args.drafter,
                          request_timeout=args.request_timeout, threads=args.threads, backend=args.backend,
                          target_rows=args.target_rows if args.target_rows == "auto" else int(args.target_rows),
                          cuda_graphs=args.cuda_graphs, prompt_cache=args.prompt_cache,
                          stored_responses=args.stored_responses)
    autoscale = None if args.min_replicas is None else (args.min_replicas, args.max_replicas)
    return application(config, args.replicas, autoscale, args.target_ongoing_requests,
                       args.api_key or os.environ.get("SPECEDGE_API_KEY"), args.max_body_bytes, args.drain_timeout,
                       args.log_level, args.cpus_per_replica)


def run(app, address: str | None = None, host: str = "127.0.0.1", port: int = 8000,
        stop: threading.Event | None = None) -> None:
    """Deploys `app` on Ray (address: a running cluster, e.g. "auto" or "ray://HEAD:10001"; None: RAY_ADDRESS, else
    a Ray started here for the run, without its dashboard), serves until SIGTERM / SIGINT (or `stop`), then takes
    it down: the whole local Ray when it was started here, only this application on a cluster (other
    applications there keep running)."""
    import ray

    owned = address is None and not os.environ.get("RAY_ADDRESS")
    stop = stop or threading.Event()
    serving = False

    def on_signal(*_):
        stop.set()
        if not serving:                 # still starting: abort the start as Ctrl+C does (cleaned up below)
            raise KeyboardInterrupt

    previous = {}
    try:
        ray.init(**({"include_dashboard": False} if owned else {"address": address}))
        # after ray.init, which sets its own SIGTERM handler (exit at once, leaving the replicas to Ray's
        # cleanup); signals reach the main thread only
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            serve.start(http_options={"host": host, "port": port})
        except Exception as err:  # noqa: BLE001 - its proxy's failure (a port taken) comes as Ray's wrapped error
            raise SpecedgeError(f"cannot listen on {host}:{port} through Ray Serve: {_last_line(err)}") from None
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
        except Exception as err:  # noqa: BLE001 - one line: the replicas' own error when Ray reports it
            raise SpecedgeError(f"the Ray Serve application did not start: {_start_error(err)}") from None
        serving = True
        log.info("serving on http://%s:%d/v1 through Ray Serve (application '%s'); Ctrl+C or SIGTERM stops it",
                 host, port, APP_NAME)
        while not stop.wait(0.5):
            pass
        log.info("stopping: requests in flight get up to the drain timeout")
    finally:
        serving = True                  # a second signal during the shutdown must not interrupt it
        try:
            if ray.is_initialized():
                if owned:
                    serve.shutdown()
                    ray.shutdown()
                else:
                    _quietly(serve.delete, APP_NAME)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        log.info("stopped")


def _start_error(err: Exception) -> str:
    """The cause of a failed start in one line: Ray's exception says only that the deployment failed; the
    deployment's status message holds the replicas' traceback, whose last `...Error: message` line is the
    cause (e.g. "OptionError: unknown policy 'x' ...")."""
    texts = [str(err)]
    try:
        app = serve.status().applications.get(APP_NAME)
        texts += [d.message for d in app.deployments.values()] if app else []
    except Exception:  # noqa: BLE001 - the status is a bonus; Ray's own message remains
        pass
    causes = [m for text in texts for m in _CAUSE.findall(text) if not m[1].startswith("Traceback")]
    return f"{causes[-1][0]}: {causes[-1][1]}" if causes else _last_line(err)


_CAUSE = re.compile(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$", re.MULTILINE)


def _last_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def _quietly(call, *args) -> None:
    try:
        call(*args)
    except Exception as err:  # noqa: BLE001 - on the way out: say it, do not mask the first error
        log.warning("could not delete the Ray Serve application: %s", _last_line(err))
