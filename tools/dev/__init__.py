"""Development-only tools: benchmarks, mutation testing, the quick start's demo inputs, the tiny
test checkpoint and the CPU lane's engine patches. Nothing here ships in a release image's
application or runs in a release build's actions except for the CPU test lane.
"""
