"""Record the digests of the default images in images/digests.json.

    bazel run //images:update_digests

Run it after a change that changes an image (code in the images, pins, locks, tools) and
commit the file with the change: //tests/system:digests_test then holds every host that builds
this commit to these digests, and explains a difference by layer and first file.
"""

import os
import sys
from pathlib import Path

from tools.oci.build_diff import main

# The images built by the default configuration; --config=release images use vendor
# bases that only an online, credentialed host can fetch.
IMAGES = ("qwen_mi300x", "deepseek_spark")

if __name__ == "__main__":
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        print(__doc__.strip())
        raise SystemExit(0)
    workspace = os.environ.get("BUILD_WORKSPACE_DIRECTORY")
    if not workspace:
        raise SystemExit("update_digests: run it with `bazel run //images:update_digests`")
    output = Path(workspace) / "images" / "digests.json"
    raise SystemExit(main(["update", "--output", str(output), *(f"{name}=images/{name}.layout" for name in IMAGES)]))
