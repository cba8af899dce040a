"""The registry stack: credentials and where they may go, the transport with one deadline per
answer, uploads, shallow bases, streamed layer reading, the runtime's overlay and referrers.
"""

# The package's face: its modules, each imported by name (nothing is imported here, so a
# program pays only for the modules it uses).
__all__ = [
    "auth",
    "copy",
    "credentials",
    "layer_files",
    "layer_stream",
    "overlay",
    "parallel",
    "pieces",
    "push",
    "referrers",
    "registry",
    "shallow_base",
    "tokens",
    "uploads",
]
