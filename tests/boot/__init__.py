"""The tests of `boot`: prepare, verify, serve and the API acceptance, against a loopback hub and stand-in
SGLang servers.
"""
