"""The formats every floor of the library shares: errors, the image layout, references, the tar
reader and its members, statements; standard library only (attest for the one error base and
JSON reader).
"""
