"""What the start-up acceptance (boot) and the speculative-decoding gate (tools/gate) both ask an
OpenAI-compatible server: one definition, so a tool call is judged the same way in both."""

from __future__ import annotations

# The one tool offered in tool-calling checks: a server must call it with a `key` argument.
LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_fixture",
        "description": "Retrieve a stored test value.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
            "additionalProperties": False,
        },
    },
}

# The structured-output check: a JSON object whose `answer` is an integer, under a strict schema.
ANSWER_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "integer"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    },
}
