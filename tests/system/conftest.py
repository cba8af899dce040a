"""The release the engine lane makes, shared by the lanes that run it (engine_e2e_test: a chroot
as a runtime runs it; podman_lane_test: the generated YAML under podman): one vendor base, one
pinned, built, pushed and verified image, one model artifact per pytest run.

Every other test of this folder loads this file too (pytest reads a folder's conftest.py), some
under Debian's own python3 with nothing installed: so it imports only pytest at the top, the
lane's fixtures inside the fixtures."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest


@pytest.fixture(scope="session")
def lane(tmp_path_factory):
    from tests.fixtures.engine_lane import Checkpoint
    from tests.fixtures.hub import LoopbackHub
    from tests.fixtures.qwen import TINY_MODEL_ID
    from tests.fixtures.registry import LoopbackRegistry
    from tests.fixtures.release_lane import ReleaseLane, hub_repo, timed

    if os.geteuid() != 0:
        pytest.fail(f"the engine lane runs an image as a runtime does: needs real root, runs as uid {os.geteuid()}")
    checkpoint = Checkpoint.of_the_lane()
    hub = hub_repo(checkpoint.path, checkpoint.revision, TINY_MODEL_ID)
    with LoopbackRegistry() as registry, LoopbackHub(hub) as served:
        lane = ReleaseLane(tmp_path_factory.mktemp("release"), registry, served)
        try:
            started = time.monotonic()
            lane.push_vendor_base()
            timed("vendor_base_push_s", started)
            yield lane
        finally:
            lane.bazel("shutdown")


@pytest.fixture(scope="session")
def pinned(lane) -> dict[str, Any]:
    """`tools/pin --write` on pins whose base is the vendor's and whose found values are empty."""
    from tests.fixtures.release_lane import BASE_TAG, ok, timed

    shipped = lane.point_pins_at_the_vendor()
    started = time.monotonic()
    run = ok(lane.pin("--base-tag", BASE_TAG, "--model-ref", "main", "--write"), "tools/pin --write")
    timed("pin_write_s", started)
    return {"output": run.stdout + run.stderr, "pins": lane.pins(), "shipped": shipped}


@pytest.fixture(scope="session")
def released(lane, pinned) -> dict[str, Any]:
    from tests.fixtures.release_lane import timed

    started = time.monotonic()
    result = lane.release()
    timed("release_build_push_verify_s", started)
    return result


@pytest.fixture(scope="session")
def model_artifact(lane, tmp_path_factory) -> tuple[Any, str]:
    """The tiny checkpoint as the engine serves it in a cluster: its model artifact (tools/model,
    with a lock made here) pushed to the lane's registry, pulled back by skopeo and unpacked by
    umoci, as a runtime makes the image volume; (the unpacked checkpoint, REGISTRY/REPO@DIGEST)."""
    from attest.lock import ARTIFACT_LOCK
    from tests.fixtures.engine_lane import Checkpoint
    from tests.fixtures.model import artifact_root, lock_of_tree
    from tests.fixtures.qwen import TINY_MODEL_ID
    from tests.fixtures.release_lane import timed

    checkpoint = Checkpoint.of_the_lane()
    started = time.monotonic()
    lock = lock_of_tree(checkpoint.path, TINY_MODEL_ID, checkpoint.revision)
    root, reference = artifact_root(lane.registry.host, checkpoint.path, lock, tmp_path_factory.mktemp("artifact"))
    timed("model_artifact_push_pull_s", started)
    assert (root / ARTIFACT_LOCK).read_bytes() == lock
    return Checkpoint(root, checkpoint.revision, checkpoint.manifest_sha256), reference


@pytest.fixture(scope="session")
def served_checkpoint(model_artifact):
    return model_artifact[0]
