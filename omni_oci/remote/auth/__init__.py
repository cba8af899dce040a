"""A registry's credentials and where they may go: found where the container ecosystem keeps
them (credentials), attached only to the registry's own origin or its token realm within the
registrable domain (authorization), and the bearer tokens of the distribution spec (tokens).
"""

# The package's face: its modules, each imported by name.
__all__ = ["authorization", "credentials", "tokens"]
