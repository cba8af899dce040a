#!/usr/bin/python3 -IS
"""Entrypoint shim: run an Omni module with Omni's own packages only.

The image runs `python3 -I -S omni-run MODULE ...`: -I ignores PYTHONPATH and the user
site, -S leaves the engine's site-packages out, so our pinned dependencies never mix
with the engine's. The engine itself is exec'd later with its own environment.
"""

import runpy
import sys

APP = "/opt/omni/app"
SITE = "/opt/omni/site-packages"

if len(sys.argv) < 2:
    sys.exit("usage: omni-run MODULE [ARGS...]")
sys.path[:0] = [APP, SITE]
module = sys.argv.pop(1)
runpy.run_module(module, run_name="__main__", alter_sys=True)
