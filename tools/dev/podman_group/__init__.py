"""The generated LeaderWorkerSet's group as Pods podman plays on one machine (docs/running.md).
It reads deploy's YAML and writes Pods."""
