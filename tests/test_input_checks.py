"""What a caller or a hand-edited bundle can get wrong: each is one clear error before any work, never a traceback,
never garbage output (the cases a new-user audit found)."""

import json
import math
import os
import shutil
import signal

import numpy as np
import pytest

from specedge.cli import _report, main
from specedge.interrupts import InterruptWatch
from specedge.errors import BundleError, OptionError
from specedge.runtime import load


def cli_error(capsys, *args) -> tuple[int, str]:
    code = main(list(args))
    lines = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in lines), lines
    return code, (lines[-1] if lines else "")


@pytest.fixture(scope="module")
def gen(arch_bundles):
    return load(arch_bundles["qwen2"])


# -- the manifest --------------------------------------------------------------------------------------------
def _edit(manifest: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for key in parents:
        manifest = manifest[key]
    manifest[last] = value


@pytest.mark.parametrize("path,value,message", [
    ("max_seq_len", "128", "max_seq_len must be an integer"),
    ("max_seq_len", -5, "max_seq_len must be an integer >= 2"),
    ("max_seq_len", 100_000, "KV slots, too few for max_seq_len 100000"),
    ("max_draft", -3, "max_draft must be an integer >= 1"),
    ("vocab_size", 300, "returns 260 logits a row, vocab_size says 300"),
    ("vocab_size", True, "vocab_size must be an integer"),
    ("eos_token_ids", "x", "eos_token_ids must be a non-empty list"),
    ("eos_token_ids", [999], "eos_token_ids must be a non-empty list of token ids below vocab_size"),
    ("tokenizer", "tokenizer.json", "tokenizer must name its 'file'"),
    ("models.target.kv", None, "needs a 'file' name and 'kv'"),
    ("models.target.max_batch", 0, "max_batch must be null or an integer >= 1"),
    ("models.draft.spec.num_layers", 7, "the draft spec and kv disagree on num_layers"),
    ("files", {}, "'files' does not list"),
    ("files.target.onnx.data", None, "files must map each file"),
    ("format_version", "3", "version '3' is not supported"),
])
def test_a_hand_edited_manifest_is_refused_in_one_line(arch_bundles, tmp_path, capsys, path, value, message):
    bundle = tmp_path / "edited"
    shutil.copytree(arch_bundles["qwen2"], bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    if path == "files.target.onnx.data":
        manifest["files"]["target.onnx.data"] = value
    else:
        _edit(manifest, path, value)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(bundle)
    for command in (["inspect", str(bundle)], ["inspect", str(bundle), "--verify"],
                    ["generate", str(bundle), "--prompt", "x"]):
        code, err = cli_error(capsys, *command)
        assert code == 1 and err.startswith("specedge: error:") and message.split(" (")[0][:30] in err, err


# -- prompts, ids and options through the Python API ----------------------------------------------------------
def test_text_that_is_not_unicode_is_an_option_error(gen, capsys):
    for prompt in ("\ud800", "ok \udcff"):                 # a lone surrogate (undecodable bytes on stdin, JSON)
        with pytest.raises(OptionError, match="not valid Unicode"):
            gen.generate(prompt, max_new_tokens=2)
    with pytest.raises(OptionError, match="prompt must be a string, got NoneType"):
        gen.generate(None)
    with pytest.raises(OptionError, match="each stop string must be a string"):
        gen.generate("x", stop=[None])
    code, err = cli_error(capsys, "generate", str(gen.path), "--prompt", "\udcff")
    assert code == 2 and "not valid Unicode" in err


@pytest.mark.parametrize("ids,message", [
    ([300], "token id 300 is outside the vocabulary"), ([-1], "token id -1 is outside"),
    ([1.5, 2], "prompt ids must be integers, got 1.5"), ("abc", "must be a list of integers"),
    ([True], "prompt ids must be integers"),
])
def test_prompt_ids_are_checked_against_the_vocabulary(gen, ids, message):
    with pytest.raises(OptionError, match=message):
        gen.generate_ids(ids, max_new_tokens=2)
    assert gen.generate_ids(np.array([5, 6], dtype=np.int64), max_new_tokens=2).prompt_tokens == 2


@pytest.mark.parametrize("options,message", [
    ({"max_new_tokens": "5"}, "max_new_tokens must be an integer, got '5'"),
    ({"max_new_tokens": True}, "max_new_tokens must be an integer"),
    ({"temperature": "0.5"}, "temperature must be a finite number"),
    ({"temperature": math.nan}, "temperature must be a finite number"),
    ({"temperature": math.inf}, "temperature must be a finite number"),
    ({"top_p": math.nan}, "top_p must be a finite number"),
    ({"seed": "a"}, "seed must be an integer"),
    ({"seed": 1.5}, "seed must be an integer"),
    ({"k": "4"}, "k must be an integer"),
    ({"k": 9}, "k must be between 0 and the bundle's max_draft 8"),
    ({"top_k": 1.5}, "top_k must be an integer"),
    ({"policy": 4}, "policy must be a name"),
    ({"stop": [1]}, "each stop string must be a string"),
    ({"stop": 5}, "stop must be a string or a list"),
    ({"stop": b"x"}, r"stop must be a string or a list of strings, got b'x'"),
    ({"stop": {"a": 1}}, "stop must be a string or a list of strings, got {'a': 1}"),
    ({"on_token": "print"}, "on_token must be a function"),
    ({"chat": "yes"}, "chat must be True or False"),
    ({"drafter": ["model"]}, "unknown drafter"),
    ({"use_draft": False, "policy": "fixed:3"}, "runs the target alone; policy 'fixed:3' would draft"),
])
def test_options_of_the_wrong_type_are_named(gen, options, message):
    with pytest.raises(OptionError, match=message):
        gen.generate("x", **options)


def test_one_stop_string_is_one_string_not_its_characters(gen):
    assert gen.options(stop="ab").stop == ("ab",)
    assert gen.options(stop=("ab", "", "c")).stop == ("ab", "c")
    greedy = gen.generate("hello", max_new_tokens=12, k=0, ignore_eos=True).text
    stop = greedy[3:6]
    assert len(stop) == 3
    assert gen.generate("hello", max_new_tokens=12, k=0, ignore_eos=True, stop=stop).text == greedy[:greedy.find(stop)]


def test_a_tiny_temperature_samples_the_argmax_not_nan(gen):
    """Dividing the logits by 1e-300 overflowed every one to inf (inf - inf = nan): garbage tokens, no error."""
    greedy = gen.generate("abc", max_new_tokens=8, k=2, ignore_eos=True).tokens
    for temperature in (1e-300, 5e-324):
        sampled = gen.generate("abc", max_new_tokens=8, k=2, ignore_eos=True, temperature=temperature, seed=3)
        assert sampled.tokens == greedy


def test_load_arguments_are_checked(arch_bundles, tmp_path):
    with pytest.raises(OptionError, match="bundle must be a folder path"):
        load(None)
    for threads in (0, 100_000):             # onnxruntime starts every thread asked for: 100000 took 16 GB
        with pytest.raises(OptionError, match=r"threads must be between 1 and \d+, got"):
            load(arch_bundles["qwen2"], threads=threads)
    with pytest.raises(OptionError, match="max_batch must be an integer"):
        load(arch_bundles["qwen2"], max_batch="2")
    (tmp_path / "file").write_text("x")
    with pytest.raises(BundleError, match="is not a folder"):
        load(tmp_path / "file")


# -- the command line -------------------------------------------------------------------------------------------
def test_bench_checks_its_output_folder_and_prompts_before_running(arch_bundles, tmp_path, capsys):
    bundle = str(arch_bundles["qwen2"])
    (tmp_path / "afile").write_text("x")
    code, err = cli_error(capsys, "bench", bundle, "--policies", "target", "--out", str(tmp_path / "afile" / "out"))
    assert code == 2 and "--out" in err
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "short"}) + "\n" + json.dumps({"prompt": "y" * 400}) + "\n")
    code, err = cli_error(capsys, "bench", bundle, "--policies", "target", "--prompts", str(prompts),
                          "--out", str(tmp_path / "out"))
    assert code == 2 and "prompt 2 has" in err and "max_seq_len 256" in err
    assert not (tmp_path / "out" / "results.json").exists()
    prompts.write_text(json.dumps({"prompt": "short", "chat": "yes"}) + "\n")
    code, err = cli_error(capsys, "bench", bundle, "--prompts", str(prompts), "--out", str(tmp_path / "out"))
    assert code == 2 and "'chat' must be true or false" in err
    for batches in ("1,,2", "1,2,"):
        code, err = cli_error(capsys, "bench", bundle, "--batch", batches, "--out", str(tmp_path / "out"))
        assert code == 2 and "--batch" in err


def test_ctrl_c_is_reported_as_an_interruption_whatever_it_became(capsys, default_sigint):
    """Ctrl+C inside a library's lazy import surfaced as ModuleNotFoundError (a traceback) or as 'backend
    unavailable' (a wrong error): once an interrupt was seen, any exception is reported as the interruption."""
    watch = InterruptWatch()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):       # the handler runs between bytecodes of this thread
                pass
        assert watch.seen
    finally:
        watch.restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert _report(ModuleNotFoundError("Could not import module 'Qwen2ForCausalLM'"), interrupted=True) == 130
    assert capsys.readouterr().err.strip() == "specedge: interrupted"
    with pytest.raises(ValueError):
        _report(ValueError("a bug"), interrupted=False)         # not swallowed: a real bug still shows


def test_a_bundle_exported_for_fewer_draft_tokens_runs_with_the_defaults(workdir, capsys):
    """--max-draft 2: the default k (4) is capped to 2 instead of refusing every call that names no k, a named
    policy decides k itself, and bench's default list leaves out fixed:4 and fixed:8."""
    import tiny_models as tm
    from conftest import _export

    target = tm.make_model("qwen2", 260, seed=1)
    bundle = _export(workdir, "max-draft-2", target, tm.perturbed(target, seed=3, noise=0.01), tm.byte_tokenizer(),
                     max_draft=2)
    gen = load(bundle)
    assert gen.options().k == 2 and gen.options(policy="adaptive", k=5).k == 5   # a policy decides k itself
    drafted_at = gen.generate("abc", max_new_tokens=24, ignore_eos=True).stats.drafted_at
    assert [n > 0 for n in drafted_at] == [True, True]          # k = 2: drafts at positions 1 and 2, never 3
    assert gen.generate("abc", max_new_tokens=8, ignore_eos=True, policy="adaptive").stats.new_tokens == 8
    with pytest.raises(OptionError, match="max_draft 2, got 3"):
        gen.generate("abc", k=3)
    assert main(["generate", str(bundle), "--prompt", "abc", "--max-new-tokens", "24", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["stats"]["acceptance_per_position"]) == 2
    out = workdir / "max-draft-2-bench"
    prompts = workdir / "max-draft-2-prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "abc"}) + "\n")
    assert main(["bench", str(bundle), "--prompts", str(prompts), "--max-new-tokens", "4", "--out", str(out)]) == 0
    configs = list(json.loads((out / "results.json").read_text())["policies"])
    assert "fixed:2" in configs and "fixed:4" not in configs and "fixed:8" not in configs


def test_inspect_says_when_backend_options_do_nothing(arch_bundles, capsys):
    code, err = cli_error(capsys, "inspect", str(arch_bundles["qwen2"]), "--backend", "cuda")
    assert code == 2 and "--backend applies with --verify" in err
    assert main(["inspect", str(arch_bundles["qwen2"])]) == 0
