import os

# pydantic would scan every installed distribution for plugins and run them inside the
# launcher; none is wanted in a fail-closed start (and the scan costs ~20 ms).
os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"

from launcher.cli import main  # noqa: E402  (after the setting above)

raise SystemExit(main())
