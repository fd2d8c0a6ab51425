"""`specedge bench` on a tiny pair: every policy side by side, results.json, table and plots."""

import json

import pytest

from specedge.bench import load_prompts, run_bench
from specedge.cli import main
from specedge.errors import OptionError
from specedge.runtime import load


def test_bench_cli_writes_results_and_plots(good_bundle, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):"}) + "\n\n" + json.dumps({"prompt": "hi", "chat": True}) + "\n")
    code = main(["bench", str(good_bundle), "--prompts", str(prompts), "--max-new-tokens", "24", "--repeat", "2",
                 "--policies", "fixed:2,heuristic,adaptive,ngram,hybrid", "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert list(results["policies"]) == ["target", "fixed:2", "heuristic", "adaptive", "ngram", "hybrid"]
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
    # K and V, per layer: [1, H_kv, max_seq_len, D] float32
    assert memory["target"]["kv_bytes"] == 2 * target["kv"]["num_layers"] * target["kv"]["num_kv_heads"] * 256 * \
        target["kv"]["head_dim"] * 4
    assert memory["total_bytes"] == sum(memory[r]["weight_bytes"] + memory[r]["kv_bytes"] for r in ("target", "draft"))
    assert results["machine"]["peak_rss_bytes"] > memory["total_bytes"]
    assert "memory: target float32 weights" in captured.out and "peak RSS" in captured.out
    for plot in ("acceptance_per_position", "accepted_lengths", "k_over_time", "tokens_per_s"):
        assert (tmp_path / "out" / f"{plot}.png").stat().st_size > 1000
    assert "fixed:2" in captured.out and "acceptance per position" in captured.out


def test_bench_rejects_bad_input(good_bundle, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt field"}\n')
    with pytest.raises(OptionError, match="needs a string field 'prompt'"):
        load_prompts(str(bad))
    assert main(["bench", str(good_bundle), "--policies", "fixed:99"]) == 2
    assert "fixed:99" in capsys.readouterr().err


def test_bench_sampled_run_reports_no_identity(good_bundle):
    gen = load(good_bundle)
    results = run_bench(gen, [{"prompt": "ab"}], ["fixed:2"], max_new_tokens=10, temperature=0.8, seed=1)
    assert results["policies"]["fixed:2"]["identical_to_target"] is None
