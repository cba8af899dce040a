"""The registry stack: credentials and where they may go, the transport with one deadline per
answer, bounded bodies, uploads, shallow bases, streamed layer reading, the runtime's overlay and referrers.
It must not import `tools.oci.build` (build actions stay offline and small) or the commands (`tools.oci.push`, `tools.oci.run_image`, `tools.oci.signing`, `tools.oci.verify`).
"""
