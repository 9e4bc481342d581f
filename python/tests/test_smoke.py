"""The Python benches and the torch demo run end to end on small sizes, so they do not rot between the runs
that produce docs/benchmarks.md's figures (assertions are on correctness, never on speed)."""
import json
import os
import subprocess
import sys

import pytest

from helpers import bench_env

SMALL_MODEL = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--intermediate", "128",
               "--vocab", "256", "--chunk-tokens", "32"]


def run(args, tmp_path):
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-m", *args, "--json", str(out)], capture_output=True, text=True,
                          timeout=300, env=bench_env())
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, json.loads(out.read_text())


def test_torch_demo(tmp_path):
    pytest.importorskip("torch")
    prompt = os.path.join(os.environ.get("CAKE_SOURCE_DIR", "../.."), "README.md")
    stdout, result = run(["cake_torch_engine", "demo", *SMALL_MODEL, "--tokens", "320", "--prompt-file", prompt],
                         tmp_path)
    assert result["bitexact"] is True
    assert "compute-only" in stdout and "Cake" in stdout
    assert result["loaded_from"] == "disk"


def test_torch_bench(tmp_path):
    pytest.importorskip("torch")
    stdout, result = run(["cake_torch_engine", "bench", *SMALL_MODEL, "--tokens", "256", "--load-ratios", "1",
                          "--sweep-step", "2"], tmp_path)
    assert result["all_bitexact"] is True
    assert len(result["rows"]) == 1 and result["rows"][0]["ttft_best_forced_s"] > 0
    assert "worst Cake / best forced split" in stdout


@pytest.mark.skipif(not os.environ.get("CAKE_BENCH"), reason="CAKE_BENCH (the cake-bench binary) is not set")
def test_client_bench(tmp_path):
    stdout, result = run(["cake_bench.client_load", "--shapes", "3", "--rounds", "1", "--runs", "1"], tmp_path)
    row = result["rows"][0]
    assert row["chunks"] == 1024 and row["python_median_s"] > 0 and row["cpp_median_s"] > 0
    assert "Python's cost per loaded chunk" in stdout
