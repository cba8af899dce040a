"""The tests of `tools.pin`: the pin command against a loopback registry and hub."""
