#!/bin/bash
# Runs cbench (libzstd/liblz4 via C, one thread) over every data set at chunk_tokens 256 and 64; JSON lines to cresults.jsonl.
set -e
cd /tmp/codec-study
gcc -O3 -march=native -Wall -o cbench cbench.c -lzstd -llz4
REPS=${REPS:-7}
: > cresults.jsonl
for spec in \
  "smollm2-bf16model-bf16 30 4096 3 64 2" "smollm2-fp32model-bf16 30 4096 3 64 2" "smollm2-fp32model-fp16 30 4096 3 64 2" \
  "smollm2-fp32model-fp32 30 4096 3 64 4" "torchllama-bf16 8 2048 8 64 2" "torchllama-fp32-as-fp16 8 2048 8 64 2" \
  "torchllama-fp32 8 2048 8 64 4"; do
  set -- $spec
  for ct in 256 64; do
    echo "$1 ct=$ct load=$(cut -d' ' -f1 /proc/loadavg)" >&2
    ./cbench data/$1.bin $2 $3 $4 $5 $6 $ct $REPS | /usr/bin/python3 -c "import json,sys; d=json.load(sys.stdin); d['data']='$1'; d['loadavg']=$(cut -d' ' -f1 /proc/loadavg); print(json.dumps(d))" >> cresults.jsonl
  done
done
