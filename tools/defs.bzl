"""Public Starlark API of Omni's build tooling."""

load(
    "//tools/private:oci.bzl",
    _OciImageInfo = "OciImageInfo",
    _OciLayerInfo = "OciLayerInfo",
    _debian_base_layer = "debian_base_layer",
    _oci_image = "oci_image",
    _oci_image_index = "oci_image_index",
    _oci_layer = "oci_layer",
    _oci_load = "oci_load",
    _oci_push = "oci_push",
    _string_setting = "string_setting",
)
load("//tools/private:py_test.bzl", _omni_py_test = "omni_py_test")

omni_py_test = _omni_py_test
oci_layer = _oci_layer
oci_image = _oci_image
oci_image_index = _oci_image_index
oci_push = _oci_push
oci_load = _oci_load
string_setting = _string_setting
debian_base_layer = _debian_base_layer
OciImageInfo = _OciImageInfo
OciLayerInfo = _OciLayerInfo
