"""The formats every floor of the library shares: errors, the image layout, references, the tar
reader and its members, statements; standard library only (attest for the one error base and
JSON reader).
"""

# The package's face: its modules, each imported by name (nothing is imported here, so a
# program pays only for the modules it uses).
__all__ = ["compression", "errors", "image_contract", "layout", "reference", "statement", "tar_members", "tar_reader"]
