"""The Python client's and its engines' benches, run from a checkout (python/ and build/python on PYTHONPATH): the
cake-kvcache package and the .deb ship the client and the engine, not these. Each is `python3 -m
cake_bench.<name>`; docs/benchmarks.md has what they measured.

client_load     the Python client's I/O-only loads against the C++ client's (cake-bench client-load)
start_to_plan   a load's fixed cost: Start to Plan on the stream opened ahead and on a fresh one, against a Ping
metrics_scrape  what a Prometheus scrape of the daemon costs, against a Ping
vllm_ttft       time to first token on a real vLLM engine (scripts/vllm-cpu-bench runs it in a venv with vLLM)
"""
