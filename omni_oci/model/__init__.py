"""Models as OCI artifacts: a checkpoint lock's files packed one per tar layer under a ModelPack
manifest and a plain image manifest, signed (OpenSSF Model Signing), pushed, pulled and verified
against the lock.
"""

# The package's face: its modules, each imported by name (nothing is imported here, so a
# program pays only for the modules it uses).
__all__ = ["artifact", "errors", "layers", "oms", "oms_keyless", "pack", "pull", "push", "sign", "verify"]
