"""omni_serving_image: one of Omni's serving images (the launcher's or boot's), the shared shape
written once over `omni_image`.

Every serving image runs `omni-run <program>` as the non-root user on the local Debian base by
default and, under `--config=release`, on the vendor base pinned in `<name>.pins.json`; it
carries the pinned Python dependencies of its platform, the entry shim and its application
layer, its SBOM inputs and the runtime contract (variables, volumes, port).

Example (images/BUILD.bazel):

    omni_serving_image(
        name = "qwen_mi300x",
        arch = "amd64",
        app = ":app_qwen",
        program = "launcher",
        port = 8103,
        env = QWEN_ENV,
        volumes = QWEN_VOLUMES,
        labels = ROCM_GROUPS,
    )
"""

load("//tools:defs.bzl", "omni_image")

ANNOTATIONS = {
    "org.opencontainers.image.source": "omni",
    "org.opencontainers.image.vendor": "Omni",
    "org.opencontainers.image.version": "0.1.0",
}

# Numeric, so Kubernetes runAsNonRoot can check it (docs/running.md).
NONROOT_USER = "1000:1000"

OMNI_RUN = [
    "/usr/bin/python3",
    "-I",
    "-S",
    "/opt/omni/bin/omni-run",
]

def base_contents(name):
    """images/NAME.base-contents.json, where tools/pin wrote it.

    What a release's SBOM lists of the vendor base (written with base.digest); a release
    refuses an SBOM without it."""
    return native.glob([name + ".base-contents.json"], allow_empty = True)

def omni_serving_image(name, arch, app, program, port, env, volumes, labels = {}, cmd = None, checkpoint_lock = None):
    """A serving image: `name`, its pins in `<name>.pins.json`, its vendor base `@<name>_vendor_base`.

    Args:
      name: the image; also the stem of its pin document and of its vendor base repository.
      arch: the platform's architecture (amd64, arm64): local base, dependencies and SBOM inputs.
      app: the application layer (the launcher's or boot's library under /opt/omni/app).
      program: what `omni-run` starts (`launcher`, `boot`).
      port: the API port the image exposes.
      env: the runtime variables (cache and model paths).
      volumes: the paths the image writes to.
      labels: extra labels, on both bases (the runtime groups the devices need).
      cmd: the program's default arguments.
      checkpoint_lock: the reviewed checkpoint lock baked beside the pins, or None.
    """
    omni_image(
        name = name,
        annotations = ANNOTATIONS | {"org.opencontainers.image.title": name},
        base = select({
            ":release": "@%s_vendor_base//:base" % name,
            "//conditions:default": ":local_base_" + arch,
        }),
        checkpoint_lock = checkpoint_lock,
        cmd = cmd,
        debian_lock = "debian.lock.json",
        entrypoint = OMNI_RUN + [program],
        env = env,
        exposed_ports = ["%d/tcp" % port],
        labels = select({
            ":release": labels | {"omni.base": "vendor (pinned in images/%s.pins.json)" % name},
            "//conditions:default": labels | {"omni.base": "omni-debian-bookworm"},
        }),
        layers = [
            ":deps_" + arch,
            ":entry_shim",
            app,
        ],
        locks = [
            "debian.lock.json",
            "//:requirements.lock",
        ],
        pins = name + ".pins.json",
        release = select({
            ":release": True,
            "//conditions:default": False,
        }),
        sbom_debian = select({
            ":release": [],
            "//conditions:default": [":debian_packages_" + arch],
        }),
        sbom_base_contents = base_contents(name),
        sbom_wheels = ["@pypi_image_cp311_%s//:wheels.json" % arch],
        user = NONROOT_USER,
        visibility = ["//visibility:public"],
        volumes = volumes,
        workdir = "/opt/omni",
    )
