"""Admin actions (§4.2 `admin`): API keys, webhook subscriptions, their deliveries and redelivery.

One async function per action, each in one transaction, failing with §12 errors; the HTTP routes under
`/v1/keys` and `/v1/subscriptions` call them. `rules.py` holds the pure request checks and decisions;
`_access.py` the in-transaction re-check of `admin` and the audit log that `keys.py`, `subscriptions.py` and
`deliveries.py` share.
"""
