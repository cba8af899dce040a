"""The build provenance of an image: an in-toto Statement v1 with a SLSA provenance v1
predicate, subject = the image manifest digest.

    python -m tools.oci.build.provenance --name NAME --digest-file D --pins PINS.json \
        --status STABLE_STATUS --lock requirements.lock [--lock images/debian.lock.json] --output OUT
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from omni_oci.format.image_contract import CHECKPOINT_LOCK_URI
from omni_oci.format.layout import read_layout
from omni_oci.format.statement import BUILDER_ID, IMAGE_BUILD_TYPE, SLSA_PROVENANCE, TOOLKIT_VERSION, statement
from tools.oci.build.image import load_pins_checked

SOURCE_URI = "git+omni"


def _dependency(name: str, uri: str, digest: dict[str, str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "uri": uri}
    if all(digest.values()):
        entry["digest"] = digest
    return entry


# The engine's installed files, by the canonical digest of its RECORD (attest.record): what pins
# an engine whose wheel records no commit, and what admission policies check beside the commit.
ENGINE_RECORD_URI = "omni-engine-record"


LOCAL_BASE_URI = "omni-local-base"  # a base built in this repository (its digest is the record)


def build_statement(
    name: str,
    digest: str,
    pins: dict[str, Any],
    source_commit: str,
    locks: dict[str, str],
    base_name: str,
    base_digest: str,
) -> dict[str, Any]:
    """`base_name`/`base_digest`: the base the image was really built on (the manifest's
    org.opencontainers.image.base.* annotations)."""
    engine, model = pins["engine"], pins["model"]
    dependencies = [
        _dependency(
            "base", f"oci://{base_name}" if base_name else LOCAL_BASE_URI, {"sha256": base_digest.split(":", 1)[-1]}
        ),
        _dependency("engine", f"git+{engine['repository']}", {"gitCommit": engine["commit"]}),
        _dependency("engine-record", ENGINE_RECORD_URI, {"sha256": engine.get("record_sha256", "")}),
        _dependency("model", f"https://huggingface.co/{model['id']}", {"gitCommit": model["revision"]}),
    ]
    if model.get("lock_sha256") is not None:
        dependencies.append(_dependency("checkpoint-lock", CHECKPOINT_LOCK_URI, {"sha256": model["lock_sha256"]}))
    if model.get("artifact"):
        artifact = model["artifact"]
        dependencies.append(
            _dependency(
                "model-artifact", f"oci://{artifact['repository']}", {"sha256": artifact["digest"].split(":", 1)[-1]}
            )
        )
    if pins.get("speculator"):
        speculator = pins["speculator"]
        dependencies.append(
            _dependency(
                "speculator", f"https://huggingface.co/{speculator['id']}", {"gitCommit": speculator["revision"]}
            )
        )
    dependencies.append(_dependency("source", SOURCE_URI, {"gitCommit": source_commit}))
    dependencies += [
        _dependency(f"lock:{lock}", f"file:{lock}", {"sha256": sha}) for lock, sha in sorted(locks.items())
    ]
    predicate = {
        "buildDefinition": {
            "buildType": IMAGE_BUILD_TYPE,
            "externalParameters": {"image": name, "pins": pins},
            "internalParameters": {"toolkit_version": TOOLKIT_VERSION},
            "resolvedDependencies": dependencies,
        },
        "runDetails": {"builder": {"id": BUILDER_ID}},
    }
    return statement([(name, digest)], SLSA_PROVENANCE, predicate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="provenance", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--name", required=True)
    parser.add_argument("--digest-file", type=Path, required=True)
    parser.add_argument("--layout", type=Path, required=True)
    parser.add_argument("--pins", type=Path, required=True)
    parser.add_argument("--status", type=Path, help="Bazel's stable status (STABLE_OMNI_SOURCE_COMMIT)")
    parser.add_argument("--lock", type=Path, action="append", default=[])
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    status = {}
    if args.status and args.status.exists():
        status = dict(line.split(" ", 1) for line in args.status.read_text().splitlines() if " " in line)
    commit = status.get("STABLE_OMNI_SOURCE_COMMIT", "").strip()
    # The same typed form the image bakes: one rendering of the pins everywhere.
    pins = load_pins_checked(args.pins, release=False)
    locks = {lock.name: hashlib.sha256(lock.read_bytes()).hexdigest() for lock in args.lock}
    _, manifest, _ = read_layout(args.layout)
    annotations = manifest.get("annotations") or {}
    statement = build_statement(
        args.name,
        args.digest_file.read_text().strip(),
        pins,
        commit if len(commit) == 40 else "",
        locks,
        annotations.get("org.opencontainers.image.base.name", ""),
        annotations.get("org.opencontainers.image.base.digest", ""),
    )
    args.output.write_text(json.dumps(statement, indent=2, sort_keys=True) + "\n")
    if len(commit) != 40:
        print(
            "provenance: no source commit (not a git checkout?): the source dependency has no digest", file=sys.stderr
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
