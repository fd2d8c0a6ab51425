"""Fill in the middle: a code model writes what goes between a prefix and a suffix; the prompt is built from the
tokenizer's own FIM tokens, through the API, the CLI, the server and bench's prompt files."""

import json
import subprocess
import sys
from dataclasses import replace

import openai
import pytest

import tiny_models as tm
from conftest import TARGET_ROWS, _export
from serve_helpers import MODEL, running, serve_bundle
from specedge.bench.runner import load_prompts
from specedge.errors import OptionError
from specedge.runtime import load

FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
PREFIX, SUFFIX = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
GREEDY = dict(max_new_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def fim_bundle(workdir):
    tok = tm.byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": FIM})          # 257 + 3 = TARGET_ROWS ids
    target = tm.make_model("qwen2", TARGET_ROWS, seed=1)
    return _export(workdir, "fim", target, tm.perturbed(target, seed=3, noise=0.01), tok, max_seq_len=128)


def test_the_prompt_is_built_from_the_tokenizer_s_fim_tokens(fim_bundle):
    gen = load(fim_bundle)
    p, s, m = (gen.tokenizer.token_to_id(t) for t in FIM)
    plain = [gen.tokenizer.encode(t, add_special_tokens=False).ids for t in (PREFIX, SUFFIX)]
    assert gen.encode(PREFIX, suffix=SUFFIX) == [p, *plain[0], s, *plain[1], m]
    result = gen.generate(PREFIX, suffix=SUFFIX, **GREEDY, k=3)
    assert result.tokens == gen.generate_ids(gen.encode(PREFIX, suffix=SUFFIX), **GREEDY, use_draft=False).tokens
    assert result.stats.n_verify > 0
    gen.close()


def test_a_suffix_without_fim_tokens_or_with_chat_is_a_clear_error(fim_bundle, workdir):
    gen = load(serve_bundle(workdir))
    with pytest.raises(OptionError, match="no fill-in-the-middle tokens"):
        gen.generate(PREFIX, suffix=SUFFIX)
    gen.close()
    gen = load(fim_bundle)
    with pytest.raises(OptionError, match="suffix .* and chat"):
        gen.generate(PREFIX, suffix=SUFFIX, chat=True)
    with pytest.raises(OptionError, match="suffix must be a string"):
        gen.generate(PREFIX, suffix=3)
    gen.close()


def test_the_server_fills_in_the_middle(fim_bundle, workdir):
    expected = load(fim_bundle).generate(PREFIX, suffix=SUFFIX, **GREEDY, use_draft=False)
    with running(fim_bundle, max_batch=1) as (srv, gen):
        c = openai.OpenAI(base_url=srv.url, api_key="-", max_retries=0)
        out = c.completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=16, temperature=0,
                                   extra_body={"ignore_eos": True})
        assert out.choices[0].text == expected.text
        assert out.usage.prompt_tokens == len(gen.encode(PREFIX, suffix=SUFFIX))
        with pytest.raises(openai.BadRequestError, match="must be text"):
            c.completions.create(model=MODEL, prompt=[1, 2, 3], suffix=SUFFIX, max_tokens=4)
    with running(serve_bundle(workdir), max_batch=2) as (srv, _):
        c = openai.OpenAI(base_url=srv.url, api_key="-", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="needs fill-in-the-middle tokens") as err:
            c.completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=4)
        assert err.value.body["param"] == "suffix" and err.value.body["code"] == "unsupported_parameter"


def test_the_cli_fills_in_the_middle(fim_bundle):
    args = [sys.executable, "-m", "specedge.cli", "generate", str(fim_bundle), "--prompt", PREFIX, "--suffix", SUFFIX,
            "--max-new-tokens", "16", "--ignore-eos", "--json"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    expected = load(fim_bundle).generate(PREFIX, suffix=SUFFIX, **GREEDY)
    assert json.loads(proc.stdout)["tokens"] == expected.tokens


def test_bench_prompt_files_take_a_suffix(tmp_path):
    good = tmp_path / "fim.jsonl"
    good.write_text(json.dumps({"prompt": PREFIX, "suffix": SUFFIX}) + "\n" + json.dumps({"prompt": "x"}) + "\n")
    assert [row["suffix"] for row in load_prompts(str(good))] == [SUFFIX, None]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": PREFIX, "suffix": SUFFIX, "chat": True}) + "\n")
    with pytest.raises(OptionError, match="'suffix' .* without chat"):
        load_prompts(str(bad))


def test_an_empty_suffix_is_no_suffix_everywhere(fim_bundle, tmp_path):
    gen = load(fim_bundle)
    assert gen.encode(PREFIX, suffix="") == gen.encode(PREFIX)
    rows = tmp_path / "p.jsonl"
    rows.write_text(json.dumps({"prompt": PREFIX, "suffix": ""}) + "\n")
    assert load_prompts(str(rows))[0]["suffix"] is None
    gen.close()


def test_a_middle_also_ends_at_the_fim_family_s_markers(fim_bundle):
    gen = load(fim_bundle)
    free = gen.generate(PREFIX, suffix=SUFFIX, max_new_tokens=12, ignore_eos=True)
    stop = free.tokens[4]                               # pretend the model's 5th token were a FIM marker
    marker_gen = load(fim_bundle)
    marker_gen.fim = replace(marker_gen.fim, ends=marker_gen.fim.ends | {stop})
    ended = marker_gen.generate(PREFIX, suffix=SUFFIX, max_new_tokens=12)
    assert ended.tokens == free.tokens[: free.tokens.index(stop) + 1] and ended.stats.stop_reason == "eos"
    assert set(gen.fim.ends) >= {gen.fim.prefix, gen.fim.suffix, gen.fim.middle}
    gen.close()
    marker_gen.close()


def test_stop_ids_end_generation_like_eos(fim_bundle):
    gen = load(fim_bundle)
    free = gen.generate(PREFIX, max_new_tokens=12, ignore_eos=True)
    ended = gen.generate(PREFIX, max_new_tokens=12, stop_ids=[free.tokens[3]], k=3)
    assert ended.tokens == free.tokens[: free.tokens.index(free.tokens[3]) + 1] and ended.stats.stop_reason == "eos"
    for bad in ([-1], [gen.vocab_size], "ab", [1.5]):
        with pytest.raises(OptionError):
            gen.generate(PREFIX, stop_ids=bad)
    gen.close()


def test_only_what_the_tokenizer_puts_before_a_text_goes_before_the_markers():
    from tokenizers import processors

    from specedge.runtime.fim import find_fim

    tok = tm.byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<s>"]})
    backend = tok.backend_tokenizer
    eos, bos = backend.token_to_id(tm.EOS), backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(single=f"$A {tm.EOS}", special_tokens=[(tm.EOS, eos)])
    assert find_fim(backend).bos == ()                  # an appended EOS stays out of the prompt
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    assert find_fim(backend).bos == (bos,)


def test_the_server_takes_stop_token_ids(fim_bundle):
    gen = load(fim_bundle)
    free = gen.generate(PREFIX, max_new_tokens=12, ignore_eos=True)
    gen.close()
    with running(fim_bundle, max_batch=1) as (srv, _):
        c = openai.OpenAI(base_url=srv.url, api_key="-", max_retries=0)
        out = c.completions.create(model=MODEL, prompt=PREFIX, max_tokens=12, temperature=0,
                                   extra_body={"stop_token_ids": [free.tokens[3]]})
        assert out.usage.completion_tokens == free.tokens.index(free.tokens[3]) + 1
        assert out.choices[0].finish_reason == "stop"
