"""Models as OCI artifacts: a checkpoint lock's files packed one per tar layer under a ModelPack
manifest and a plain image manifest, signed (OpenSSF Model Signing), pushed, pulled and verified
against the lock.
"""
