"""The registry stack: the verbs (registry, uploads, referrers, the image push, shallow bases)
apart from the session's request policy (retries, Retry-After, deadlines); credentials and where
they may go (auth/); a remote image's files read from its streamed layers (layers/).
"""

# The package's face: its modules, each imported by name (nothing is imported here, so a
# program pays only for the modules it uses).
__all__ = [
    "auth",
    "copy",
    "layers",
    "parallel",
    "pieces",
    "push",
    "referrers",
    "registry",
    "session",
    "shallow_base",
    "uploads",
]
