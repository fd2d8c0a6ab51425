"""The CLI end to end on a tiny pair, in a fresh process as a user runs it."""

import json
import re
import subprocess
import sys

import pytest

import tiny_models as tm


def specedge(*args, check=True, env=None):
    proc = subprocess.run([sys.executable, "-m", "specedge.cli", *args], capture_output=True, text=True, timeout=300,
                          env=env)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def cli_bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    tok = tm.byte_tokenizer(chat=True)
    target = tm.make_model("llama", 260, seed=11)
    tm.save(target, tok, root / "target")
    tm.save(tm.perturbed(target, seed=12, noise=0.01), tok, root / "draft")
    proc = specedge("export", "--target", str(root / "target"), "--draft", str(root / "draft"),
                    "--out", str(root / "bundle"), "--max-seq-len", "128", "--max-draft", "6")
    for stage in ("reading target", "writing step graph", "checking the graph", "max logit error", "wrote"):
        assert stage in proc.stderr
    return root / "bundle"


def test_inspect(cli_bundle):
    out = specedge("inspect", str(cli_bundle), "--verify").stdout
    assert "LlamaForCausalLM" in out and "max_draft 6" in out and "checksums verified" in out
    assert "memory: weights + KV of one slot" in out and "verify rows bitwise equal: yes" in out
    assert re.search(r"KV \d+\.\d (KiB|MiB) per slot", out) and " 0.0 MiB" not in out   # tiny sizes in KiB
    assert "verify rows bitwise equal to single steps on this machine (cpu): yes (a lone token as 1 row)" in out
    assert "embedding float32" in out
    manifest = json.loads(specedge("inspect", str(cli_bundle), "--json").stdout)
    assert manifest["format_version"] == 3 and set(manifest["models"]) == {"target", "draft"}
    assert "verify_rows_bitwise_equal_here" not in manifest
    checked = json.loads(specedge("inspect", str(cli_bundle), "--json", "--verify").stdout)
    assert checked["verify_rows_bitwise_equal_here"] is True and checked["target_min_rows_here"] == 1


def test_output_to_a_stream_that_is_not_utf8(cli_bundle):
    """Windows writes redirected output as cp1252: text it lacks prints as '?', and --json stays lossless (ASCII
    escapes) instead of a UnicodeEncodeError traceback."""
    import os

    args = ["generate", str(cli_bundle), "--prompt", "世界 ", "--max-new-tokens", "12", "--ignore-eos", "--no-draft"]
    utf8 = json.loads(specedge(*args, "--json").stdout)
    cp1252 = {**os.environ, "PYTHONIOENCODING": "cp1252"}
    raw = subprocess.run([sys.executable, "-m", "specedge.cli", *args, "--json"], capture_output=True, timeout=300,
                         env=cp1252)
    assert raw.returncode == 0 and raw.stdout.isascii(), raw.stderr
    assert json.loads(raw.stdout) == {**utf8, "stats": json.loads(raw.stdout)["stats"]}
    text = subprocess.run([sys.executable, "-m", "specedge.cli", *args, "--prompt", "世界 ü"], capture_output=True,
                          timeout=300, env=cp1252)
    assert text.returncode == 0 and b"Traceback" not in text.stderr, text.stderr


def test_generate_json_and_baseline(cli_bundle):
    args = ["generate", str(cli_bundle), "--prompt", "def fib(n):", "--max-new-tokens", "40", "--ignore-eos", "--json"]
    spec = json.loads(specedge(*args, "--k", "3").stdout)
    base = json.loads(specedge(*args, "--no-draft").stdout)
    assert set(spec) == {"text", "tokens", "prompt_tokens", "stats"}
    assert spec["tokens"] == base["tokens"] and len(spec["tokens"]) == 40
    assert spec["prompt_tokens"] == len("def fib(n):".encode())
    assert spec["stats"]["verify_calls"] > 0 and spec["stats"]["mean_accepted_length"] > 1.5
    assert base["stats"]["drafted_tokens"] == 0 and base["stats"]["mean_accepted_length"] == 1.0
    for key in ("acceptance_per_position", "tokens_per_s", "time_s", "top_rejections", "drafted_tokens"):
        assert key in spec["stats"]
    with_logprobs = json.loads(specedge(*args, "--k", "3", "--logprobs", "2").stdout)
    assert [e["token"] for e in with_logprobs["logprobs"]] == spec["tokens"]
    assert all(len(e["top"]) == 2 and e["logprob"] <= 0 for e in with_logprobs["logprobs"])
    refused = specedge("generate", str(cli_bundle), "--prompt", "x", "--logprobs", "2", check=False)
    assert refused.returncode == 2 and "--logprobs goes with --json" in refused.stderr


def test_target_rows_option(cli_bundle):
    args = ["generate", str(cli_bundle), "--prompt", "def fib(n):", "--max-new-tokens", "8", "--ignore-eos", "--json"]
    assert len(json.loads(specedge(*args, "--target-rows", "1").stdout)["tokens"]) == 8
    padded = json.loads(specedge(*args, "--target-rows", "2").stdout)      # any graph can pad a lone token
    assert padded["tokens"] == json.loads(specedge(*args).stdout)["tokens"]


def test_generate_streams_text_then_stats(cli_bundle):
    proc = specedge("generate", str(cli_bundle), "--prompt", "héllo", "--max-new-tokens", "20", "--ignore-eos")
    as_json = json.loads(specedge("generate", str(cli_bundle), "--prompt", "héllo", "--max-new-tokens", "20",
                                  "--ignore-eos", "--json").stdout)
    assert proc.stdout == as_json["text"] + "\n"
    assert "mean accepted length" in proc.stderr and "tok/s" in proc.stderr and "KV memory per slot" in proc.stderr


def test_generate_chat_and_sampling(cli_bundle):
    args = ["generate", str(cli_bundle), "--prompt", "hi", "--chat", "--max-new-tokens", "10", "--json",
            "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--seed", "5"]
    a, b = json.loads(specedge(*args).stdout), json.loads(specedge(*args).stdout)
    assert a["tokens"] == b["tokens"]
    # "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n": 3 special tokens + 18 byte tokens
    assert a["prompt_tokens"] == 21


def test_quantized_export_and_inspect(tmp_path):
    tok = tm.byte_tokenizer()
    target = tm.make_model("llama", 260, seed=11)
    tm.save(target, tok, tmp_path / "target")
    tm.save(tm.perturbed(target, seed=12, noise=0.01), tok, tmp_path / "draft")
    proc = specedge("export", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
                    "--out", str(tmp_path / "bundle"), "--max-seq-len", "64", "--draft-quantize", "int8",
                    "--block-size", "16", "--quantize-embeddings")
    assert "draft: writing step graph (int8 weights)" in proc.stderr and "top-1 agreement" in proc.stderr
    out = specedge("inspect", str(tmp_path / "bundle")).stdout
    assert "weights float32" in out and "weights int8 (blocks of 16)" in out and "vs source model: top-1 agreement" in out
    assert "embedding float32" in out and "embedding quantized" in out
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["models"]["draft"]["quantization"]["block_size"] == 16
    base = json.loads(specedge("generate", str(tmp_path / "bundle"), "--prompt", "ab", "--max-new-tokens", "30",
                               "--ignore-eos", "--json", "--no-draft").stdout)
    spec = json.loads(specedge("generate", str(tmp_path / "bundle"), "--prompt", "ab", "--max-new-tokens", "30",
                               "--ignore-eos", "--json", "--k", "4").stdout)
    assert spec["tokens"] == base["tokens"]


def test_chat_keeps_the_conversation_and_prefills_only_each_new_turn(cli_bundle):
    proc = subprocess.run([sys.executable, "-m", "specedge.cli", "chat", str(cli_bundle), "--max-new-tokens", "8",
                           "--system", "Be brief."], input="hello\n\nsecond question\n/reset\nthird\n",
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    turns = [line for line in proc.stderr.splitlines() if line.startswith("[8 tokens")]
    assert len(turns) == 3, proc.stderr                      # the empty line is no turn
    cached = [int(line.split(" tokens, ")[-1].split(" from the cache")[0]) for line in turns]
    prompts = [int(line.split("prompt ")[1].split(" tokens")[0]) for line in turns]
    assert cached[0] == 0 and cached[1] > prompts[0] // 2       # turn 2 starts from turn 1's text
    assert prompts[2] < prompts[1]                              # /reset: a new conversation
    assert "(a new conversation)" in proc.stderr


def test_chat_without_a_chat_template_is_a_one_line_error(tmp_path):
    tok = tm.byte_tokenizer()
    tm.save(tm.make_model("llama", 260, seed=11), tok, tmp_path / "target")
    specedge("export", "--target", str(tmp_path / "target"), "--draft", "none", "--out", str(tmp_path / "b"),
             "--max-seq-len", "64")
    proc = specedge("chat", str(tmp_path / "b"), check=False)
    assert proc.returncode == 1 and proc.stderr.strip().count("\n") == 0
    assert "no chat template" in proc.stderr


def test_chat_goes_on_after_a_turn_that_fails(cli_bundle):
    """A message that no longer fits the bundle's max_seq_len (128 here) is dropped with one line; the session and
    the conversation before it go on."""
    proc = subprocess.run([sys.executable, "-m", "specedge.cli", "chat", str(cli_bundle), "--max-new-tokens", "4"],
                          input="x" * 200 + "\nhello\n", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "the message was dropped" in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("[4 tokens")]) == 1
    # a system prompt that leaves no room for any turn (/reset keeps it) is refused before the first line
    proc = specedge("chat", str(cli_bundle), "--system", "y" * 200, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "--system: with a one-word message the prompt has" in proc.stderr and "max_seq_len 128" in proc.stderr


def test_ctrl_c_during_a_reply_stops_it_wherever_it_lands(cli_bundle, monkeypatch, default_sigint):
    """Ctrl+C while the terminal is being written (not inside the stream): the reply still stops, and the
    interruption counts as handled (a later error is reported as itself)."""
    import specedge.chat_repl as repl
    from specedge.interrupts import InterruptWatch
    from specedge.runtime import load

    gen = load(cli_bundle)
    echoes = {"n": 0}

    def echo_interrupted_once(*args, **kwargs):
        echoes["n"] += 1
        if echoes["n"] == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(repl.click, "echo", echo_interrupted_once)
    watch = InterruptWatch()
    try:
        watch.seen = True                                  # as the SIGINT handler leaves it
        result, _ = repl._reply(gen, [{"role": "user", "content": "hi"}], dict(max_new_tokens=60, ignore_eos=True))
    finally:
        watch.restore()
    assert result.stats.stop_reason == "cancelled" and result.stats.new_tokens < 60
    assert watch.seen is False
    gen.close()
