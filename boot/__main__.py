# The stop handlers first, before the imports (a second or so): as PID 1 of its pod, boot must end
# at once on SIGTERM from its first moment, not only once main() runs (attest.edge.refusal).
from attest.edge.refusal import ending_at_once_on_stop

with ending_at_once_on_stop("boot"):
    from boot.cli import main

    raise SystemExit(main())
