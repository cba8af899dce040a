"""SGLang served: its command line and checks before it starts, the process group's supervision
and readiness, and the API acceptance (smoke, warm-up) against it. Above `boot.settings`; never
`boot.checkpoint`: serving starts on a verified checkpoint, whatever verified it.
"""
