"""string_setting: a string build setting (//images:base selects local or release bases)."""

def _string_setting_impl(_ctx):
    return []

_STRING_SETTING_EXAMPLE = """

Example:

    string_setting(name = "base", build_setting_default = "local")
    config_setting(name = "release", flag_values = {":base": "release"})
"""

string_setting = rule(
    implementation = _string_setting_impl,
    build_setting = config.string(flag = True),
    doc = "A string flag (`--//images:base=release`, set by `--config=release`) that config_setting selects on." + _STRING_SETTING_EXAMPLE,
)
