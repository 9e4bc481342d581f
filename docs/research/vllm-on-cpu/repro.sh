#!/bin/bash
# Reproduces the scheduler-only venv from the pinned files beside this script, then runs the driver, in a scratch
# folder ($VLLM_RESEARCH_DIR, default /tmp/vllm-research). Debian's interpreter makes the venv: the first python3 on
# PATH may be another.
set -e
here="$(cd "$(dirname "$0")" && pwd)"
work="${VLLM_RESEARCH_DIR:-/tmp/vllm-research}"
mkdir -p "$work"
cp "$here"/*.py "$here"/*.txt "$work"/
cd "$work"
rm -rf venv2
/usr/bin/python3 -m venv venv2
venv2/bin/pip install -q torch==2.13.0
venv2/bin/pip install -q -r requirements-vllm-deps.txt
venv2/bin/pip install -q --no-deps -r requirements-vllm-nodeps.txt
venv2/bin/python drive_scheduler.py --async 2>&1 | grep -E "jumps|left|Error"
venv2/bin/python drive_scheduler.py 2>&1 | grep -E "jumps|left|Error"
du -sh venv2
echo DONE
