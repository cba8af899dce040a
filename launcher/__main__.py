import os

# pydantic would scan every installed distribution for plugins and run them inside the
# launcher; none is wanted in a fail-closed start (and the scan costs ~20 ms).
os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"

# The stop handlers before the imports: as PID 1 of its pod, the launcher must end at once on
# SIGTERM from its first moment, not only once main() runs (attest.edge.refusal).
from attest.edge.refusal import ending_at_once_on_stop  # noqa: E402  (after the setting above)

with ending_at_once_on_stop("launcher"):
    from launcher.cli import main

    raise SystemExit(main())
