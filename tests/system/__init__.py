"""The suites that cross packages: hostile peers, no data loss, non-root images, the quick start,
the digests, the docs, the engine lanes, settings, the oldest Python and GPU acceptance.
"""
