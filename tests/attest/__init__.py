"""The tests of `attest`: documents, pins, locks, records, trees, hashing and the bounded readers, each
refusal in a table.
"""
