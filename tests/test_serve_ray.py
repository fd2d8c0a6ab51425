"""`specedge serve BUNDLE --ray --replicas 2`: two replicas of the tiny serve bundle, each with its own batched
engine, behind Ray Serve's one route on loopback; the official openai client against that route. The Ray tests
are skipped without the `ray` extra (pip install 'specedge[ray]'); the one that starts Ray takes about 20-25 s
on a 2-core machine (Ray, its Serve controller and proxy, two replicas: serving after 14-19 s; 4-5 s to stop)."""

import concurrent.futures
import os
import signal
import sys
import time

import pytest

pytest.importorskip("starlette")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from serve_helpers import MODEL, serve_bundle, serve_process  # noqa: E402
from specedge.cli import main  # noqa: E402

# Ray Serve's own config models use a pydantic form deprecated in pydantic 2 (not ours to fix)
pytestmark = pytest.mark.filterwarnings("ignore:Using extra keyword arguments on `Field`:DeprecationWarning")

PROMPT = "def fib(n):"
START_TIMEOUT_S = 120          # Ray, then two replicas loading the bundle: 14-19 s here; generous for a loaded box


def _ray_serve():
    try:
        import ray.serve  # noqa: F401
    except ImportError:
        pytest.skip("the 'ray' extra is not installed (pip install 'specedge[ray]')")


@pytest.fixture(scope="module")
def bundle(workdir):
    return serve_bundle(workdir)


def _port_ray_leaves_alone() -> int:
    """A free port outside Ray's worker range (10002-19999) and the kernel's ephemeral range (32768 up), from which
    the processes ray.init starts take theirs: a port picked there could be taken before Serve's proxy binds it."""
    import random
    import socket

    for port in random.sample(range(20000, 32000), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in 20000-31999")


def _wait_serving(base: str, proc, log) -> None:
    """Until the command says it serves (Ray Serve reports the application running a little after the first
    replica answers /health) and a replica answers."""
    end = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < end:
        assert proc.poll() is None, "specedge serve --ray exited before serving:\n" + log.read_text()[-3000:]
        if "serving on http://" in log.read_text():
            try:
                answer = httpx.get(base + "/health", timeout=2)
                if answer.status_code == 200 and "replica" in answer.json():
                    return
            except (httpx.HTTPError, ValueError):
                pass
        time.sleep(0.25)
    raise AssertionError(f"not serving on {base} after {START_TIMEOUT_S} s:\n" + log.read_text()[-3000:])


def test_two_replicas_behind_one_route(bundle, tmp_path):
    _ray_serve()
    from specedge.runtime import load

    port = _port_ray_leaves_alone()
    log = tmp_path / "serve-ray.log"
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}    # never a real cluster
    env.update(PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0")
    started = time.monotonic()
    # --replica-cpus 0.5: both replicas fit in Ray's count of this machine's CPUs even on one core
    with serve_process([str(bundle), "--ray", "--replicas", "2", "--port", str(port), "--max-batch", "2",
                        "--threads", "1", "--replica-cpus", "0.5", "--served-model-name", MODEL], log, env) as proc:
        base = f"http://127.0.0.1:{port}"
        _wait_serving(base, proc, log)
        ready_s = time.monotonic() - started
        client = openai.OpenAI(base_url=base + "/v1", api_key="-", max_retries=0, timeout=60)

        gen = load(bundle, threads=1)                       # the same engine, here: what greedy decoding gives
        expected = gen.generate(PROMPT, max_new_tokens=12, ignore_eos=True, use_draft=False).text
        expected_chat = gen.generate("hi", chat=True, max_new_tokens=8, ignore_eos=True, use_draft=False).text
        gen.close()

        def complete(_):
            raw = client.completions.with_raw_response.create(model=MODEL, prompt=PROMPT, max_tokens=12,
                                                              temperature=0, extra_body={"ignore_eos": True})
            return raw.headers["x-specedge-replica"], raw.parse()

        # concurrent requests: Ray routes each to the less loaded of two replicas, so both get some
        replicas = set()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for _ in range(5):
                for replica, out in pool.map(complete, range(4)):
                    replicas.add(replica)
                    assert out.choices[0].text == expected and out.usage.completion_tokens == 12
                    assert out.model_extra["speculation"]["stop_reason"] == "max_new_tokens"
                if len(replicas) == 2:
                    break
        assert len(replicas) == 2, f"one replica answered everything: {replicas}"

        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0,
            extra_body={"ignore_eos": True})
        chat = raw.parse()
        assert raw.headers["x-specedge-replica"] in replicas
        assert chat.choices[0].message.content == expected_chat

        chunks = list(client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected_chat
        assert chunks[-1].usage.completion_tokens == 8 and "speculation" in chunks[-1].model_extra
        served_s = time.monotonic() - started

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    total_s = time.monotonic() - started
    text = log.read_text()
    assert "stopping: requests in flight" in text and text.rstrip().endswith("stopped"), text[-3000:]
    assert "POST /v1/completions 200" in text                 # the replicas' request lines reach the command's log
    print(f"\nray: ready {ready_s:.1f}s, requests done {served_s:.1f}s, stopped {total_s:.1f}s")


def test_build_target_for_serve_run(bundle):
    """What `serve run specedge.serve.ray_app:build bundle=... min_replicas=1 max_replicas=3` builds (no Ray
    started: an application is a description until it runs)."""
    _ray_serve()
    from pydantic import ValidationError
    from ray import serve

    from specedge.serve import ray_app

    args = ray_app.BuildArgs.model_validate({"bundle": str(bundle), "min_replicas": "1", "max_replicas": "3"})
    assert isinstance(ray_app.build(args), serve.Application)
    assert isinstance(ray_app.build(ray_app.BuildArgs(bundle=str(bundle), replicas=2)), serve.Application)
    with pytest.raises(ValidationError, match="min_replicas and max_replicas"):
        ray_app.BuildArgs.model_validate({"bundle": str(bundle), "min_replicas": "1"})
    with pytest.raises(ValidationError, match="replica"):
        ray_app.BuildArgs.model_validate({"bundle": str(bundle), "replica": "2"})         # a typo is refused


def test_a_port_taken_is_a_one_line_error_on_ray_too(bundle, tmp_path):
    """Ray Serve's proxy reports a port it cannot bind as a wrapped RuntimeError: one line, as without --ray."""
    _ray_serve()
    import socket

    port = _port_ray_leaves_alone()
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env.update(PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with serve_process([str(bundle), "--ray", "--replicas", "1", "--port", str(port), "--threads", "1",
                            "--replica-cpus", "0.5"], tmp_path / "log", env) as proc:
            assert proc.wait(START_TIMEOUT_S) == 1
    last = (tmp_path / "log").read_text().strip().splitlines()[-1]      # (Ray's actors log their own traces above)
    assert last.startswith(f"specedge: error: cannot listen on 127.0.0.1:{port} through Ray Serve"), last


def test_without_ray_a_one_line_error(bundle, monkeypatch, capsys):
    import specedge.serve

    monkeypatch.delitem(sys.modules, "specedge.serve.ray_app", raising=False)
    monkeypatch.delattr(specedge.serve, "ray_app", raising=False)      # else `from specedge.serve import` finds it
    for name in ("ray", "ray.serve"):
        monkeypatch.setitem(sys.modules, name, None)            # `import ray` fails as if it were not installed
    assert main(["serve", str(bundle), "--ray", "--replicas", "2"]) == 1
    err = capsys.readouterr().err
    assert "pip install 'specedge[ray]'" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_ray_options_need_ray(bundle, capsys):
    assert main(["serve", str(bundle), "--replicas", "2"]) == 2
    assert "--replicas only applies with --ray" in capsys.readouterr().err
    assert main(["serve", str(bundle), "--replicas", "2", "--autoscale", "1:3"]) == 2
    assert "--replicas, --autoscale only apply with --ray" in capsys.readouterr().err
    assert main(["serve", str(bundle), "--ray", "--replicas", "2", "--autoscale", "1:3"]) == 2
    assert main(["serve", str(bundle), "--ray", "--autoscale", "3:1"]) == 2
    err = capsys.readouterr().err
    assert "not both" in err and "MIN:MAX" in err
