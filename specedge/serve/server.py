"""Running the app under uvicorn: the foreground server of `specedge serve` (SIGTERM / Ctrl+C drain in-flight
requests for up to drain_timeout seconds, then cancel them and exit), and a server in a thread on an ephemeral
port (tests, bench-serve, scripts)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import socket
import threading
import time

import uvicorn

from specedge.errors import SpecedgeError
from specedge.serve.app import DEFAULT_MAX_BODY_BYTES, create_app
from specedge.serve.protocol import Limits

log = logging.getLogger("specedge.serve")


CANCEL_GRACE_S = 5.0          # after the drain: time for cancelled requests to end their responses cleanly


def _config(app, host: str, port: int, drain_timeout: float) -> uvicorn.Config:
    # uvicorn's own limit is the backstop: it cancels the handlers themselves (a cut-off response)
    return uvicorn.Config(app, host=host, port=port, http="h11", loop="asyncio", ws="none", lifespan="on",
                          log_config=None, access_log=False, timeout_graceful_shutdown=drain_timeout + CANCEL_GRACE_S,
                          server_header=False)


class _DrainingServer(uvicorn.Server):
    """uvicorn's shutdown (stop accepting, wait for in-flight responses), plus: once drain_timeout has passed,
    the requests still running are cancelled through the runtime (their slots freed at the next step), so that
    each ends with a proper error (a 503, or an error event and [DONE] in a stream) instead of a cut connection."""

    def __init__(self, config: uvicorn.Config, service, drain_timeout: float):
        super().__init__(config)
        self.service, self.drain_timeout = service, drain_timeout
        self._draining_loop: asyncio.AbstractEventLoop | None = None        # set once shutdown begins
        self._signals_while_draining = 0

    def handle_exit(self, sig, frame) -> None:
        """A second SIGTERM / Ctrl+C while draining ends the drain now: what still runs is cancelled as at the drain
        timeout (each request ends with its error, a stream with an error event and [DONE]). uvicorn's own answer,
        a forced exit, cut streams mid-chunk, answered plain-text 500s and logged CancelledError tracebacks. A third
        signal (a request that does not end) forces the exit."""
        if self.should_exit and self._draining_loop is not None and sig in (signal.SIGINT, signal.SIGTERM):
            self._signals_while_draining += 1
            if self._signals_while_draining == 1:
                self._draining_loop.call_soon_threadsafe(self._cancel_now)  # a signal handler: no locks taken here
            else:
                self.force_exit = True
            return
        super().handle_exit(sig, frame)

    def _cancel_now(self) -> None:
        n = self.service.cancel_all("shutdown")
        log.warning("second signal: drain ended, cancelled %d request(s) still running", n)

    async def shutdown(self, sockets=None) -> None:
        self._draining_loop = asyncio.get_running_loop()

        async def expire():
            await asyncio.sleep(self.drain_timeout)
            n = self.service.cancel_all("shutdown")
            if n:
                log.warning("drain timeout (%gs) over: cancelled %d request(s) still running", self.drain_timeout, n)

        if self.service.active:
            log.info("draining %d request(s) in flight (up to %gs)", len(self.service.active), self.drain_timeout)
        timer = asyncio.ensure_future(expire())
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    """A bound socket for host:port (port 0: any free one), or a one-line SpecedgeError saying why not: bound
    before the model loads, so a port in use fails at once and clearly."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, address = infos[0]
        # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that say so, and without it Nagle's
        # algorithm held every response on a kept-alive connection ~40 ms for the client's delayed ACK
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as err:
        raise SpecedgeError(f"cannot listen on {host}:{port}: {getattr(err, 'strerror', None) or err}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise SpecedgeError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return sock


def serve_forever(gen, limits: Limits, sock: socket.socket, api_key: str | None = None,
                  drain_timeout: float = 30.0, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
    """Serves on a bound socket (listen) until SIGTERM / SIGINT; drains, closes the generator, returns."""
    host, port = sock.getsockname()[:2]
    if not is_loopback(host) and not api_key:
        log.warning("listening on %s without --api-key: anyone who can reach this port can use the server", host)
    app = create_app(gen, limits, api_key=api_key, max_body_bytes=max_body_bytes)
    server = _DrainingServer(_config(app, host, port, drain_timeout), app.state.service, drain_timeout)
    # uvicorn re-raises the signal that stopped it once it is done, with the handler it found: a quiet one, so
    # that we get to close the generator and exit normally
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        log.info("serving %s on http://%s:%d/v1 (max batch %d, default policy %s, prompt cache %s, drain timeout "
                 "%gs%s)", limits.model, _url_host(host), port, gen.max_batch, limits.policy,
                 "on" if gen.prompt_cache else "off", drain_timeout, ", API key required" if api_key else "")
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        gen.close()
        sock.close()
        log.info("stopped")
    if not server.started:
        raise SpecedgeError(f"could not serve on {host}:{port} (see the log above)")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class ServerThread:
    """The app served by uvicorn in a background thread, on an ephemeral loopback port unless told otherwise.

        with ServerThread(gen, Limits(model="m")) as server:
            client = OpenAI(base_url=server.url, api_key="-")
    """

    def __init__(self, gen, limits: Limits, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 drain_timeout: float = 5.0, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self.app = create_app(gen, limits, api_key=api_key, max_body_bytes=max_body_bytes)
        self.service = self.app.state.service
        self.sock = listen(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.server = _DrainingServer(_config(self.app, host, self.port, drain_timeout), self.service, drain_timeout)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name="specedge-serve")

    @property
    def base(self) -> str:
        return f"http://{_url_host(self.host)}:{self.port}"

    @property
    def url(self) -> str:
        return self.base + "/v1"

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self.thread.start()
        end = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > end:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """As SIGTERM does: stop accepting, drain (up to drain_timeout), cancel the rest, stop."""
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
