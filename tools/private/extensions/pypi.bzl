"""Module extension: third-party Python packages from Omni's hashed lock.

`pypi.lock(name, lock)` creates a repository holding one `py_library` per locked
distribution (`@pypi//:pydantic`, `@pypi//:huggingface_hub`, ...), installed for the Python
interpreter found on the machine, and `@pypi//:python_toolchain` bound to that interpreter.
`pypi.site(name, lock, python_version, platform, packages)` unpacks (some of) a lock's wheels,
chosen for that CPython and platform (not the host's), into one directory that tests read in
place (`site.json`): the real engines and what their parsers import.
"""

_HELPER = Label("//tools/private:pypi_repo.py")
_UNPACK = Label("//tools/private:wheel_unpack.py")
_FACTS = Label("//tools/private:wheel_facts.py")

def _run(rctx, argv, what):
    result = rctx.execute(argv, quiet = True, environment = {"PIP_CONFIG_FILE": "/dev/null"})
    if result.return_code != 0:
        fail("pypi: {} failed ({}):\n{}\n{}".format(what, result.return_code, result.stdout, result.stderr))
    return result.stdout

def _pypi_repo_impl(rctx):
    python = rctx.os.environ.get("OMNI_PYTHON") or rctx.which("python3")
    if not python:
        fail("pypi: no python3 on PATH; install Python 3.11+ or set OMNI_PYTHON to an interpreter")
    helper = rctx.path(_HELPER)
    lock = rctx.path(rctx.attr.lock)

    # The helper prints the interpreter's real path and, for each locked distribution,
    # the wheel best matching that interpreter's tags.
    plan = json.decode(_run(rctx, [python, helper, "plan", lock], "choosing wheels from " + str(lock)))
    for wheel in plan["wheels"]:
        # sha256 makes this a repository-cache hit after the first fetch: no network.
        rctx.download(
            url = [wheel["url"]],
            output = "wheels/" + wheel["filename"],
            sha256 = wheel["sha256"],
        )
    _run(rctx, [plan["python"], helper, "install", "wheels", "site", plan["python"]], "installing wheels")

pypi_repo = repository_rule(
    implementation = _pypi_repo_impl,
    attrs = {"lock": attr.label(mandatory = True, allow_single_file = True)},
    environ = ["OMNI_PYTHON"],
)

def _pypi_image_site_impl(rctx):
    helper = rctx.path(_HELPER)
    lock = rctx.path(rctx.attr.lock)

    rctx.path(_UNPACK)  # refetch when the unpacker changes

    # The host interpreter that installed @pypi runs the helpers; nothing of it reaches the
    # site (no pip here: see wheel_unpack.py).
    python = rctx.read(rctx.path(Label("@pypi//:python.txt"))).strip()
    plan = json.decode(_run(rctx, [
        python,
        helper,
        "image-plan",
        lock,
        rctx.attr.python_version,
        rctx.attr.platform,
    ] + rctx.attr.packages, "choosing image wheels"))
    for wheel in plan["wheels"]:
        rctx.download(url = [wheel["url"]], output = "wheels/" + wheel["filename"], sha256 = wheel["sha256"])

    # What each wheel says of its license, makers and copyright: the SBOM's facts (read before
    # the wheels are unpacked or dropped).
    rctx.path(_FACTS)  # refetch when the reader changes
    facts = json.decode(_run(rctx, [python, helper, "image-facts", "wheels"], "reading the wheels' metadata"))
    wheels = [dict(wheel, facts = facts[wheel["filename"]]) for wheel in plan["wheels"]]
    if rctx.attr.as_tar:
        _run(
            rctx,
            [python, helper, "image-tar", "wheels", "site.tar", rctx.attr.python_version, rctx.attr.platform],
            "unpacking image wheels into site.tar",
        )
        rctx.delete("wheels")  # in the repository cache already; the tar is what layers read
        rctx.file("BUILD.bazel", 'package(default_visibility = ["//visibility:public"])\n\n' +
                                 'exports_files(["site.tar", "wheels.json"])\n')
    else:
        _run(
            rctx,
            [python, helper, "image-install", "wheels", "site", rctx.attr.python_version, rctx.attr.platform],
            "installing image wheels",
        )

    # What the deps layer holds, with each wheel's sha256 and facts: the SBOM's Python packages.
    rctx.file("wheels.json", json.encode_indent(wheels, indent = "  ") + "\n")

pypi_image_site = repository_rule(
    implementation = _pypi_image_site_impl,
    attrs = {
        "lock": attr.label(mandatory = True, allow_single_file = True),
        "python_version": attr.string(mandatory = True),
        "platform": attr.string(mandatory = True),
        "packages": attr.string_list(),
        "as_tar": attr.bool(),
    },
)

def _pypi_site_impl(rctx):
    helper = rctx.path(_HELPER)
    lock = rctx.path(rctx.attr.lock)
    rctx.path(_UNPACK)  # refetch when the unpacker changes
    python = rctx.read(rctx.path(Label("@pypi//:python.txt"))).strip()
    target = [rctx.attr.python_version, rctx.attr.platform]
    plan = json.decode(_run(
        rctx,
        [python, helper, "image-plan", lock] + target + rctx.attr.packages,
        "choosing wheels from " + str(lock),
    ))
    for wheel in plan["wheels"]:
        rctx.download(url = [wheel["url"]], output = "wheels/" + wheel["filename"], sha256 = wheel["sha256"])
    _run(rctx, [python, helper, "site", "wheels", "site"] + target, "unpacking wheels")

    # Too many files for runfiles (torch alone has ~15,000): tests read the site where it lies,
    # through site.json, which changes whenever a wheel does.
    rctx.file("site.json", json.encode_indent({
        "site": str(rctx.path("site")),
        "wheels_dir": str(rctx.path("wheels")),
        "wheels": plan["wheels"],
        "python_version": rctx.attr.python_version,
        "platform": rctx.attr.platform,
    }, indent = "  ") + "\n")
    rctx.file("BUILD.bazel", 'exports_files(["site.json"])\n')

pypi_site = repository_rule(
    implementation = _pypi_site_impl,
    attrs = {
        "lock": attr.label(mandatory = True, allow_single_file = True),
        "python_version": attr.string(mandatory = True),
        "platform": attr.string(mandatory = True),
        "packages": attr.string_list(doc = "Only these distributions of the lock; all when empty."),
    },
)

_site_tag = tag_class(attrs = {
    "name": attr.string(mandatory = True),
    "lock": attr.label(mandatory = True, doc = "A lock made by `tools/lock_python --exact`: the whole set."),
    "python_version": attr.string(mandatory = True, doc = "The CPython that runs the site, e.g. 3.11."),
    "platform": attr.string(mandatory = True, doc = "linux/amd64 or linux/arm64."),
    "packages": attr.string_list(doc = "Only these distributions of the lock (no closure); all when empty."),
})

_image_site_tag = tag_class(attrs = {
    "name": attr.string(mandatory = True),
    "lock": attr.label(mandatory = True),
    "python_version": attr.string(mandatory = True, doc = "The image's CPython, e.g. 3.11."),
    "platform": attr.string(mandatory = True, doc = "linux/amd64 or linux/arm64."),
    "packages": attr.string_list(doc = "Root distributions; their locked closure is installed (all: empty)."),
    "as_tar": attr.bool(doc = "One site.tar instead of a site/ glob: for sites of tens of thousands of files."),
})

_lock_tag = tag_class(attrs = {
    "name": attr.string(mandatory = True),
    "lock": attr.label(mandatory = True),
})

def _pypi_impl(module_ctx):
    for mod in module_ctx.modules:
        for tag in mod.tags.lock:
            pypi_repo(name = tag.name, lock = tag.lock)
        for tag in mod.tags.site:
            pypi_site(
                name = tag.name,
                lock = tag.lock,
                python_version = tag.python_version,
                platform = tag.platform,
                packages = tag.packages,
            )
        for tag in mod.tags.image_site:
            pypi_image_site(
                name = tag.name,
                lock = tag.lock,
                python_version = tag.python_version,
                platform = tag.platform,
                packages = tag.packages,
                as_tar = tag.as_tar,
            )

pypi = module_extension(
    implementation = _pypi_impl,
    tag_classes = {"lock": _lock_tag, "image_site": _image_site_tag, "site": _site_tag},
)
