"""`specedge serve`: an OpenAI-compatible local server on the runtime's continuous batching (needs the `serve`
extra: starlette, uvicorn, prometheus-client). The runtime itself imports none of this.

    app.py        routes, auth, size limits, error shape, SSE, one log line per request
    bridge.py     the asyncio event loop <-> the generator's worker thread
    protocol.py   request validation and mapping to runtime options; response objects
    metrics.py    Prometheus metrics        rejections.py   rejected-token analytics
    steps.py      the recent decode steps, numbered (GET /v1/speculation/steps)
    server.py     uvicorn: foreground with SIGTERM drain, or in a thread (tests, bench-serve)
"""

from specedge.serve.protocol import Limits


def create_app(*args, **kwargs):
    from specedge.serve.app import create_app as make

    return make(*args, **kwargs)


__all__ = ["Limits", "create_app"]
