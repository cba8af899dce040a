"""The registry stack: the verbs (registry, uploads, referrers, the image push, shallow bases,
streamed layer reading, the runtime's overlay) apart from the session's request policy
(retries, Retry-After, deadlines), and credentials and where they may go.
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
    "session",
    "shallow_base",
    "tokens",
    "uploads",
]
