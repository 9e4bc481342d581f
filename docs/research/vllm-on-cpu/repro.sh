#!/bin/bash
# Reproduces the scheduler-only venv from the pinned files, then runs the driver.
set -e
cd /tmp/vllm-research
rm -rf venv2
python3 -m venv venv2
venv2/bin/pip install -q torch==2.13.0
venv2/bin/pip install -q -r requirements-vllm-deps.txt
venv2/bin/pip install -q --no-deps -r requirements-vllm-nodeps.txt
venv2/bin/python drive_scheduler.py --async 2>&1 | grep -E "jumps|left|Error"
venv2/bin/python drive_scheduler.py 2>&1 | grep -E "jumps|left|Error"
du -sh venv2
echo DONE
