"""The tests of `tools.gate`: corpus, parity, benchmark, the judge and the OpenAI client, against scripted
loopback servers.
"""
