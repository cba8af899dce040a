"""The no-GPU quick start's inputs: a synthetic Qwen-shaped checkpoint, a fake vLLM distribution, keys."""
