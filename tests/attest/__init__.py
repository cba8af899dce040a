"""The tests of `attest`: documents, pins, locks, records, trees, hashing and the bounded readers, each
refusal in a table. They must not import `vllm`, `sglang` or `torch`.
"""
