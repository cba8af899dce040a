"""Public Starlark API of Omni's build tooling: the OCI rules by concern (as rules_img splits
them), each implemented in tools/private/<concern>.bzl, and the test macro."""

load("//tools/private:debian_layer.bzl", _debian_base_layer = "debian_base_layer")
load("//tools/private:image.bzl", _oci_image = "oci_image", _omni_image = "omni_image")
load("//tools/private:index.bzl", _oci_image_index = "oci_image_index")
load("//tools/private:layer.bzl", _oci_layer = "oci_layer")
load("//tools/private:load.bzl", _oci_load = "oci_load")
load("//tools/private:manifests.bzl", _omni_manifests = "omni_manifests")
load(
    "//tools/private:providers.bzl",
    _OciBaseInfo = "OciBaseInfo",
    _OciImageInfo = "OciImageInfo",
    _OciLayerInfo = "OciLayerInfo",
)
load("//tools/private:push.bzl", _oci_push = "oci_push")
load("//tools/private:py_test.bzl", _omni_py_test = "omni_py_test")
load("//tools/private:settings.bzl", _string_setting = "string_setting")

omni_py_test = _omni_py_test
oci_layer = _oci_layer
oci_image = _oci_image
omni_image = _omni_image
omni_manifests = _omni_manifests
oci_image_index = _oci_image_index
oci_push = _oci_push
oci_load = _oci_load
string_setting = _string_setting
debian_base_layer = _debian_base_layer
OciBaseInfo = _OciBaseInfo
OciImageInfo = _OciImageInfo
OciLayerInfo = _OciLayerInfo
