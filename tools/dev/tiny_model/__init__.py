"""The tiny Qwen3.5-shaped checkpoint the CPU engine lane serves, written byte for byte (no torch).
A build action: standard library only."""
