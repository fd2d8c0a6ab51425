"""`specedge bench` on a tiny pair: every policy side by side, results.json, table and plots."""

import json
import math
import statistics

import pytest

from specedge.bench import load_prompts, run_bench
from specedge.bench.bandwidth import bytes_per_token, copy_bandwidth
from specedge.cli import main
from specedge.errors import OptionError
from specedge.runtime import load


def test_bench_cli_writes_results_and_plots(good_bundle, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):"}) + "\n\n" + json.dumps({"prompt": "hi", "chat": True}) + "\n")
    code = main(["bench", str(good_bundle), "--prompts", str(prompts), "--max-new-tokens", "24", "--repeat", "2",
                 "--policies", "fixed:2,heuristic,adaptive,adaptive@ngram,adaptive@hybrid", "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert list(results["policies"]) == ["target", "fixed:2", "heuristic", "adaptive", "adaptive@ngram", "adaptive@hybrid"]
    for name, p in results["policies"].items():
        assert p["identical_to_target"] is True
        assert len(p["requests"]) == 4 and all(len(r["tokens"]) == 24 for r in p["requests"])
        for key in ("tok_per_s", "speedup", "mean_accepted_length", "acceptance_per_position", "k_mean"):
            assert key in p
    assert results["policies"]["target"]["speedup"] == 1.0
    assert results["policies"]["fixed:2"]["k_mean"] > 1.5
    assert results["policies"]["adaptive"]["k_history"]
    assert "machine" in results and results["bundle"]["max_draft"] == 8
    memory, manifest = results["memory"], json.loads((good_bundle / "manifest.json").read_text())
    target = manifest["models"]["target"]
    assert memory["target"]["weight_bytes"] == target["weight_bytes"]
    # K and V, per layer: [1, H_kv, slots, D] float32 (slots: max_seq_len 256 + the variant's headroom)
    assert target["kv"]["slots"] > 256
    assert memory["target"]["kv_bytes"] == 2 * target["kv"]["num_layers"] * target["kv"]["num_kv_heads"] * \
        target["kv"]["slots"] * target["kv"]["head_dim"] * 4 == memory["target"]["kv_slot_bytes"]
    assert memory["total_bytes"] == sum(memory[r]["weight_bytes"] + memory[r]["kv_bytes"] for r in ("target", "draft"))
    assert results["machine"]["peak_rss_bytes"] > memory["total_bytes"]
    assert "memory: target float32 weights" in captured.out and "peak RSS" in captured.out
    for plot in ("acceptance_per_position", "accepted_lengths", "k_over_time", "tokens_per_s"):
        assert (tmp_path / "out" / f"{plot}.png").stat().st_size > 1000
    assert "fixed:2" in captured.out and "acceptance per position" in captured.out
    _check_bandwidth_and_prediction(results, target)
    assert "bandwidth: read" in captured.out and "meas/pred" in captured.out and "copy" not in captured.out
    assert results["machine"]["cpu"] and f"cpu: {results['machine']['cpu']}" in captured.out
    assert results["machine"]["target_steps_exact"] is True and results["bandwidth"]["read_kernel"] in ("sum", "matvec")


def test_target_only_plots_draw_without_warnings(good_bundle, tmp_path):
    """A target-only run has no labelled series in three of the four plots: no empty-legend warning."""
    import warnings

    from specedge.bench.report import plots, table

    results = run_bench(load(good_bundle), [{"prompt": "def f(x):"}], ["target"], max_new_tokens=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = plots(results, tmp_path)
    assert len(written) == 4 and all(path.stat().st_size > 1000 for path in written)
    assert "top rejected" not in table(results)                 # nothing was drafted: no empty section


def test_bench_table_aligns_long_policy_names(good_bundle):
    from specedge.bench.report import table

    results = run_bench(load(good_bundle), [{"prompt": "def f(x):"}], ["fixed:2", "adaptive:stop@hybrid"],
                        max_new_tokens=8)
    head, _, *rows = table(results).splitlines()[:5]
    assert [row.split()[0] for row in rows] == ["target", "fixed:2", "adaptive:stop@hybrid"]
    tok_s = head.index("tok/s") + len("tok/s")                  # right-aligned numbers end under their header
    assert all(row[tok_s - 1].isdigit() and row[tok_s] == " " for row in rows)


def _check_bandwidth_and_prediction(results, target_entry):
    bw, policies = results["bandwidth"], results["policies"]
    assert bw["bytes_per_token"] == bytes_per_token(target_entry)
    assert bw["read_bytes_per_s"] >= bw["read_bytes_per_s_median"] > 0
    assert bw["bound_tok_per_s"] == pytest.approx(bw["read_bytes_per_s"] / bw["bytes_per_token"])   # the read bound
    assert bw["fraction_of_bound"] == pytest.approx(policies["target"]["decode_tok_per_s"] / bw["bound_tok_per_s"])
    # the prediction, recomputed from the raw per-request stats
    def costs(name):
        stats = [r["stats"] for r in policies[name]["requests"]]
        calls = sum(s["target_calls"] for s in stats)
        draft_calls = sum(s["draft_calls"] for s in stats)
        return (sum(s["new_tokens"] - 1 for s in stats) / calls, sum(s["drafted_tokens"] for s in stats) / calls,
                sum(s["time_s"]["draft"] for s in stats) / draft_calls if draft_calls else 0.0,
                sum(s["time_s"]["verify"] for s in stats) / calls)
    def predicted_tok_per_s(name, step_cost):
        stats = [r["stats"] for r in policies[name]["requests"]]
        seconds = sum(s["time_s"]["prefill"] for s in stats) + sum(s["target_calls"] for s in stats) * step_cost
        return sum(s["new_tokens"] for s in stats) / seconds
    plain = costs("target")[3]
    assert policies["target"]["predicted_speedup"] == pytest.approx(1.0)
    tokens, drafts, draft_cost, verify_cost = costs("fixed:2")
    assert tokens > 1.5 and drafts == pytest.approx(2.0)
    predicted = predicted_tok_per_s("fixed:2", drafts * draft_cost + verify_cost) / predicted_tok_per_s("target", plain)
    assert policies["fixed:2"]["predicted_speedup"] == pytest.approx(predicted)
    assert policies["fixed:2"]["measured_vs_predicted"] == pytest.approx(policies["fixed:2"]["speedup"] / predicted)


def test_bandwidth_probe_stays_out_of_the_peak_rss():
    """bench reports the run's peak RSS; the probe's buffers (here 2 x 128 MiB) live in a child process."""
    from specedge.bench.bandwidth import copy_bandwidth_in_child
    from specedge.runtime.memory import peak_rss_bytes

    before = peak_rss_bytes()
    bw = copy_bandwidth_in_child(nbytes=128 << 20, repeats=2)
    assert bw["bytes"] == 128 << 20 and bw["best"] >= bw["median"] > 0 and bw["read_best"] > 0
    assert peak_rss_bytes() - before < 64 << 20


def test_bytes_per_token_skips_gather_only_embeddings():
    spec = {"vocab_size": 100, "hidden_size": 8, "tied_embeddings": True}
    embedding = 100 * 8 * 4
    assert bytes_per_token({"spec": spec, "weight_bytes": 10_000}) == 10_000           # fp32 head reads it all
    assert bytes_per_token({"spec": {**spec, "tied_embeddings": False}, "weight_bytes": 10_000}) == 10_000 - embedding
    assert bytes_per_token({"spec": spec, "weight_bytes": 10_000, "weights": "int4"}) == 10_000 - embedding
    # a quantized table: its stored size, not the fp32 size
    assert bytes_per_token({"spec": spec, "weight_bytes": 10_000, "weights": "int4", "embedding_bytes": 500}) == 9_500


def test_copy_bandwidth_measures_something():
    bw = copy_bandwidth(nbytes=8 << 20, repeats=3, threads=2)
    assert bw["threads"] == 2 and bw["bytes"] == 8 << 20 and bw["best"] >= bw["median"] > 1e8
    assert bw["read_best"] >= bw["read_median"] > 1e8 and bw["read_kernel"] in ("sum", "matvec")
    odd = copy_bandwidth(nbytes=(8 << 20) + 12, repeats=1, threads=1)      # rounded to whole product rows
    assert odd["bytes"] == 8 << 20 and odd["read_best"] > 1e8


def test_the_bandwidth_child_runs_blas_on_the_models_threads(monkeypatch):
    """The matrix-vector read runs on BLAS threads, which read their count at import: a child started inside
    blas_threads inherits it, and the parent's environment is restored after."""
    import os

    from specedge.bench.bandwidth import blas_threads

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    with blas_threads(1):
        assert os.environ["OPENBLAS_NUM_THREADS"] == os.environ["OMP_NUM_THREADS"] == "1"
    assert "OPENBLAS_NUM_THREADS" not in os.environ and os.environ["OMP_NUM_THREADS"] == "7"
    with blas_threads(None):
        assert os.environ["OMP_NUM_THREADS"] == "7"


def test_bench_rejects_bad_input(good_bundle, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt field"}\n')
    with pytest.raises(OptionError, match="needs a string field 'prompt'"):
        load_prompts(str(bad))
    bad.write_text('{"prompt": "x"}\n{"prompt": ""}\n')
    with pytest.raises(OptionError, match=r"bad.jsonl:2: the prompt is empty"):
        load_prompts(str(bad))
    bad.write_text('{"prompt": "", "suffix": "return x"}\n{"prompt": "", "chat": true}\n')
    assert len(load_prompts(str(bad))) == 2                            # a fill in the middle, a chat turn: tokens
    assert main(["bench", str(good_bundle), "--policies", "fixed:99"]) == 2
    assert "fixed:99" in capsys.readouterr().err


def test_bench_says_when_a_prompt_leaves_room_for_fewer_tokens_than_asked(good_bundle, tmp_path, capsys):
    """The bundle's max_seq_len (256) ends a run early: every policy's alike, so the comparison holds, but the
    user is told, with the room the longest prompt leaves, which is what its runs then generate."""
    gen = load(good_bundle)
    long = "def f(x): return x\n" * 200
    while len(gen.encode(long)) > 220:
        long = long[:-10]
    room = 256 - len(gen.encode(long)) + 1
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):"}) + "\n" + json.dumps({"prompt": long}) + "\n")
    assert main(["bench", str(good_bundle), "--prompts", str(prompts), "--max-new-tokens", str(room + 9),
                 "--policies", "fixed:2", "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert f"warning: 1 of 2 prompts leave room for fewer than --max-new-tokens {room + 9} (the least: prompt 2, " \
           f"{room}); their runs stop at the bundle's max_seq_len 256" in err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [len(r["tokens"]) for r in results["policies"]["fixed:2"]["requests"]] == [room + 9, room]
    assert main(["bench", str(good_bundle), "--prompts", str(prompts), "--max-new-tokens", str(room),
                 "--policies", "fixed:2", "--out", str(tmp_path / "out")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_bench_on_a_bundle_without_a_chat_template(arch_bundles, tmp_path, capsys):
    """The built-in set's chat prompt is left out, said; a prompts file asking for chat is a one-line error."""
    bundle = arch_bundles["qwen2"]                                     # a byte tokenizer without a template
    assert main(["bench", str(bundle), "--max-new-tokens", "4", "--policies", "fixed:2",
                 "--out", str(tmp_path / "out")]) == 0
    assert "no chat template: the 1 built-in chat prompt(s) left out" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "results.json").read_text())["settings"]["prompts"] == 3
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"prompt": "b", "chat": True}) + "\n")
    assert main(["bench", str(bundle), "--prompts", str(prompts), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert 'prompt 2 asks for chat ("chat": true) and this bundle has no chat template' in err and "--chat" not in err


def test_bench_sampled_run_reports_no_identity(good_bundle):
    gen = load(good_bundle, threads=1)
    results = run_bench(gen, [{"prompt": "ab"}], ["fixed:2"], max_new_tokens=10, temperature=0.8, seed=1)
    assert results["policies"]["fixed:2"]["identical_to_target"] is None
    assert results["bandwidth"]["threads"] == 1                  # the read bound of the threads the model runs on


def test_cpu_description_names_the_vector_extensions(tmp_path, monkeypatch):
    from specedge.bench import runner
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU 9000\nflags\t\t: fpu sse2 avx2 fma avx512f amx_int8\n")
    real_path = runner.Path
    monkeypatch.setattr(runner, "Path", lambda p: info if p == "/proc/cpuinfo" else real_path(p))
    assert runner.cpu_description() == "Some CPU 9000 (AVX2, AVX-512, AMX-INT8)"


def test_batch_workload_is_one_request_list_for_every_size():
    from specedge.bench.batch import MAX_WORKLOAD, workload_size

    assert workload_size([1, 2, 4, 8]) == 8
    assert workload_size([1, 3]) == 3
    assert workload_size([2, 3]) == 6
    assert workload_size([1, 7, 9, 64]) == 64 and math.lcm(7, 9, 64) > MAX_WORKLOAD


def test_batch_bench_keeps_each_cells_steps_once_the_event_ring_is_full(standard_bundles):
    """The scheduler keeps only its most recent step records: a cell's steps are counted by the step counter, so a
    full ring still gives every cell its own (the ring's length stops growing once full)."""
    from collections import deque

    from specedge.bench.batch import run_batch_bench
    from specedge.runtime import load

    gen = load(standard_bundles["qwen2"], max_batch=2)
    gen.scheduler.events = deque(maxlen=6)                   # full after the warm-up
    prompts = [{"prompt": "ab"}, {"prompt": "xyz"}]
    results = run_batch_bench(gen, prompts, ["fixed:4"], [1, 2], max_new_tokens=12, repeat=2)
    for b, waves in (("1", 2), ("2", 1)):          # the last 6 steps of each wave (>= 11 steps), 2 repeats
        fixed, target = results["batches"][b]["fixed:4"], results["batches"][b]["target"]
        assert fixed["k_mean"] >= 1 and 0 < len(fixed["k_per_step"]) <= 2 * waves * 6, fixed["k_per_step"]
        assert target["k_mean"] == 0 and len(target["k_per_step"]) == 2 * waves * 6


@pytest.mark.parametrize("interleave", ["wave", "cell"])
def test_batch_bench_interleaves_configurations_wave_by_wave(standard_bundles, interleave):
    """--interleave wave: every configuration's wave i runs before any configuration's wave i + 1, the order
    reversing from wave to wave; cell: all of one configuration's waves, then the next's. Either way each
    configuration's results are its requests in order, and vs_best_other is the per-repeat ratio."""
    from specedge.bench.batch import run_batch_bench
    from specedge.runtime import load

    gen = load(standard_bundles["qwen2"], max_batch=2)
    submitted = []
    stream = gen.stream

    def logged(prompt, **options):
        submitted.append((options["policy"], prompt, options["max_new_tokens"]))
        return stream(prompt, **options)

    gen.stream = logged
    prompts = [{"prompt": "ab"}, {"prompt": "xyz"}]
    results = run_batch_bench(gen, prompts, ["fixed:4"], [1, 2], max_new_tokens=6, repeat=2, interleave=interleave)
    measured = [(policy, prompt) for policy, prompt, n in submitted if n == 6]     # warm-up: 8 tokens
    t, f = "target", "fixed:4"
    if interleave == "wave":       # B = 1: 2 waves of one request; B = 2: one wave of both
        expected = [(t, "ab"), (f, "ab"), (f, "xyz"), (t, "xyz"), (t, "ab"), (t, "xyz"), (f, "ab"), (f, "xyz"),
                    (f, "ab"), (t, "ab"), (t, "xyz"), (f, "xyz"), (f, "ab"), (f, "xyz"), (t, "ab"), (t, "xyz")]
    else:
        expected = [(t, "ab"), (t, "xyz"), (f, "ab"), (f, "xyz"), (t, "ab"), (t, "xyz"), (f, "ab"), (f, "xyz"),
                    (f, "ab"), (f, "xyz"), (t, "ab"), (t, "xyz"), (f, "ab"), (f, "xyz"), (t, "ab"), (t, "xyz")]
    assert measured == expected
    assert results["settings"]["interleave"] == interleave
    for b in ("1", "2"):
        cells = results["batches"][b]
        assert cells["fixed:4"]["identical_to_target"] is True
        assert len(cells["fixed:4"]["per_request_tokens"]) == 2
        fixed, target = (cells[n]["aggregate_tok_per_s_per_repeat"] for n in ("fixed:4", "target"))
        assert cells["fixed:4"]["vs_best_other_per_repeat"] == pytest.approx([a / b for a, b in zip(fixed, target)])
        assert cells["target"]["vs_best_other"] == pytest.approx(
            statistics.median(b / a for a, b in zip(fixed, target)))
        waves = {n: cells[n]["wave_tok_per_s"] for n in ("fixed:4", "target")}
        assert len(waves["target"]) == 2 * (2 if b == "1" else 1)            # 2 repeats of 2 or 1 waves
        assert cells["fixed:4"]["paired"]["target"]["pairs"] == len(waves["target"])
        assert cells["fixed:4"]["paired"]["target"]["ratio"] == pytest.approx(
            math.exp(statistics.fmean(math.log(a / t) for a, t in zip(waves["fixed:4"], waves["target"]))))


def test_batch_bench_refuses_an_unknown_interleave(standard_bundles):
    from specedge.bench.batch import run_batch_bench
    from specedge.runtime import load

    with pytest.raises(OptionError, match="interleave must be one of wave, cell"):
        run_batch_bench(load(standard_bundles["qwen2"], max_batch=2), [{"prompt": "ab"}], [], [1, 2],
                        interleave="row")


def test_benchmark_configurations_alternate_their_order_by_repeat():
    from specedge.bench.order import alternating

    assert [alternating(["a", "b", "c"], r) for r in range(3)] == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]


def test_a_configuration_is_compared_with_the_best_other_repeat_by_repeat():
    from specedge.bench.order import against_best

    per_repeat = {"a": [10.0, 12.0, 9.0], "b": [11.0, 10.0, 9.5], "c": [8.0, 13.0, 9.0]}
    assert against_best(per_repeat, "a")["vs_best_other_per_repeat"] == pytest.approx([10 / 11, 12 / 13, 9 / 9.5])
    assert against_best(per_repeat, "a")["vs_best_other"] == pytest.approx(12 / 13)
    assert against_best({"a": [1.0]}, "a") == {}
    # another configuration that made nothing (every request failed) gives no ratio, not a ZeroDivisionError
    assert against_best({"a": [5.0, 6.0], "b": [0.0, 3.0]}, "a") == {"vs_best_other_per_repeat": [None, 2.0],
                                                                     "vs_best_other": 2.0}
    assert against_best({"a": [5.0], "b": [0.0]}, "a") == {"vs_best_other_per_repeat": [None], "vs_best_other": None}


def test_paired_ratio_is_the_geometric_mean_of_the_pairs_with_a_t_interval():
    from specedge.bench.order import paired_ratio

    got = paired_ratio([10.0, 20.0, 9.0], [10.0, 10.0, 10.0])
    logs = [0.0, math.log(2.0), math.log(0.9)]
    mean, half = statistics.fmean(logs), 4.303 * statistics.stdev(logs) / math.sqrt(3)
    assert got["ratio"] == pytest.approx(math.exp(mean)) and got["pairs"] == 3
    assert got["low"] == pytest.approx(math.exp(mean - half)) and got["high"] == pytest.approx(math.exp(mean + half))
    # a constant ratio: no spread, so the interval closes on it
    assert paired_ratio([9.0, 18.0], [10.0, 20.0]) == pytest.approx({"ratio": 0.9, "low": 0.9, "high": 0.9, "pairs": 2})
    assert paired_ratio([9.0], [10.0])["low"] is None and paired_ratio([], []) == {}


def test_bench_batches_cli(workdir, tmp_path, capsys):
    """bench --batch: every configuration at every batch size, outputs identical to target-only at each."""
    import tiny_models as tm
    from conftest import TARGET_ROWS, _export

    target = tm.make_model("qwen2", TARGET_ROWS, seed=1)
    bundle = _export(workdir, "bench-standard", target, tm.perturbed(target, seed=3, noise=0.01), tm.byte_tokenizer(),
                     attention="standard")
    code = main(["bench", str(bundle), "--batch", "1,3", "--policies", "fixed:4,adaptive", "--max-new-tokens", "16",
                 "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["sizes"] == [1, 3] and results["configs"] == ["target", "fixed:4", "adaptive"]
    for b in ("1", "3"):
        for name, entry in results["batches"][b].items():
            assert entry["identical_to_target"] is True and entry["aggregate_tok_per_s"] > 0
        assert results["batches"][b]["target"]["k_mean"] == 0
    assert results["batches"]["3"]["fixed:4"]["k_mean"] > 1
    # every batch size ran the same three requests (B = 1: one after another), and outputs follow the request
    assert results["settings"]["requests_per_batch_size"] == 3
    for b in ("1", "3"):
        assert len(results["batches"][b]["target"]["per_request_tokens"]) == 3
    assert results["batches"]["1"]["target"]["per_request_tokens"] == results["batches"]["3"]["target"]["per_request_tokens"]
    # the three in one batch took about a third of the target calls they took one after another
    assert results["batches"]["3"]["target"]["target_calls"] < results["batches"]["1"]["target"]["target_calls"] / 2
    for plot in ("throughput_vs_batch", "k_vs_batch"):
        assert (tmp_path / "out" / f"{plot}.png").stat().st_size > 1000
    assert "agg tok/s" in captured.out
    assert main(["bench", str(bundle), "--batch", "0,x"]) == 2
    assert "--batch" in capsys.readouterr().err
