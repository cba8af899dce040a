"""The registry stack: credentials and where they may go, the transport with one deadline per
answer, uploads, shallow bases, streamed layer reading, the runtime's overlay and referrers.
"""
