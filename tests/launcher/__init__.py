"""The tests of `launcher`: its refusals, hostile inputs, the engine probe over fake installed
distributions and the server command it builds.
"""
