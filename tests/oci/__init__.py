"""The tests of `tools.oci` and the OCI rules: layers, images, pushes, verification, registry
authentication and hostile registries, on a loopback docker-registry.
"""
