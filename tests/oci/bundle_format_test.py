"""Every Sigstore bundle Omni writes (the image's signature, provenance, SPDX and CycloneDX
bundles, and the OMS model signature) comes from one writer and parses with sigstore-models, the
schema the Sigstore clients share (issue 70, point 3); each reader takes both key-hint forms
Omni writes, and no other key's.

sigstore-python's `Bundle.from_json` is run too, and its answer written down: 4.5.1 reads only
bundles signed with a certificate (its `_verify` asks for one), so it refuses every key-method
bundle, Omni's and cosign's `--key` ones alike; the row fails, and says so, the day it reads them."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from omni_oci.format.errors import OciError
from omni_oci.format.statement import SLSA_PROVENANCE
from omni_oci.model import oms
from omni_oci.model.errors import ModelError
from omni_oci.signing.bundles import (
    CYCLONEDX_PREDICATE,
    SIGN_PREDICATE,
    SPDX_PREDICATE,
    bundle,
    bundle_document,
    open_bundle,
    statement,
)
from omni_oci.signing.keys import key_hint, pem_hint

DIGEST = "sha256:" + "ab" * 32
KEY = ec.generate_private_key(ec.SECP256R1())
OTHER = ec.generate_private_key(ec.SECP256R1())
RESOURCES = {"config.json": "1" * 64, "model.safetensors": "2" * 64}


def _written() -> dict[str, bytes]:
    """What Omni writes, by what it is."""
    images = {
        predicate: bundle(KEY, statement(DIGEST, predicate, {"x": 1}))
        for predicate in (SIGN_PREDICATE, SLSA_PROVENANCE, SPDX_PREDICATE, CYCLONEDX_PREDICATE)
    }
    return {**images, "model.sig (OMS)": oms.sign(KEY, oms.statement("tiny", RESOURCES))}


@pytest.mark.parametrize("what", list(_written()))
def test_every_bundle_omni_writes_parses_with_sigstore_models(what: str) -> None:
    from sigstore_models.bundle.v1 import Bundle

    data = _written()[what]
    parsed = Bundle.from_json(data.decode())
    assert parsed.verification_material.tlog_entries == []  # no log entry: the list is there, empty
    assert parsed.dsse_envelope is not None and json.loads(data)["mediaType"].endswith("v0.3+json")


def test_sigstore_python_reads_certificate_bundles_only() -> None:
    from sigstore.errors import Error
    from sigstore.models import Bundle

    with pytest.raises(Error, match="expected certificate in bundle"):
        Bundle.from_json(_written()[SIGN_PREDICATE])


@pytest.mark.parametrize("hint", [key_hint, pem_hint], ids=["cosign's", "model_signing's"])
def test_both_readers_take_either_hint_form_omni_writes(hint) -> None:
    about = statement(DIGEST, SIGN_PREDICATE, {})
    image_bundle = json.dumps(bundle_document(KEY, about, hint=hint(KEY.public_key()))).encode()
    assert open_bundle(image_bundle, KEY.public_key(), DIGEST, "b")["predicateType"] == SIGN_PREDICATE
    model = oms.statement("tiny", RESOURCES)
    model_bundle = json.dumps(bundle_document(KEY, model, hint=hint(KEY.public_key()), keyid="")).encode()
    assert oms.verified(model_bundle, KEY.public_key(), "model.sig").resources == RESOURCES


def test_a_hint_naming_another_key_is_refused_by_both_readers() -> None:
    about = statement(DIGEST, SIGN_PREDICATE, {})
    named_other = json.dumps(bundle_document(KEY, about, hint=key_hint(OTHER.public_key()))).encode()
    with pytest.raises(OciError) as refused:
        open_bundle(named_other, KEY.public_key(), DIGEST, "b")
    assert refused.value.field == "bundle.verificationMaterial"
    model = oms.statement("tiny", RESOURCES)
    named_other = json.dumps(bundle_document(KEY, model, hint=pem_hint(OTHER.public_key()), keyid="")).encode()
    with pytest.raises(ModelError) as refused_model:
        oms.verified(named_other, KEY.public_key(), "model.sig")
    assert refused_model.value.field == "hint"
