"""The speculative-decoding gate generator: parity and benchmark of a speculative endpoint
against an autoregressive one of the same target, written as the gate the launcher checks.
It talks to servers over HTTP only."""
