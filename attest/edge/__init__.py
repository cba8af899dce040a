"""The program edge every command shares: its settings from the environment, redaction of what it
prints, its one refusal line, the readiness probe, the HTTP transport, the bounded body reader and
the data plane that carries every blob body. It builds on the documents in `attest`, and nothing
else of Omni's.
"""
