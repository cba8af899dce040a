"""Write the JSON Schema of every attest document: `export_schemas OUT_DIR`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attest.documents import CheckpointAttestation, Document
from attest.profile import TargetProfile
from attest.speculation import DFlash2Gate, SpeculatorAttestation

SCHEMAS: dict[str, type[Document]] = {
    "checkpoint_attestation": CheckpointAttestation,
    "speculator_attestation": SpeculatorAttestation,
    "dflash2_gate": DFlash2Gate,
    "target_profile": TargetProfile,
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: export_schemas OUT_DIR  (writes <document>.schema.json for each document)", file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name, model in sorted(SCHEMAS.items()):
        schema = model.model_json_schema()
        (out / f"{name}.schema.json").write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
