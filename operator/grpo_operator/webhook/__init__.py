"""The validating admission webhook: review (pure: the decision, the very validator of `grpojob check`), server
(kopf registration and HTTPS endpoint) and certs (a CA and serving certificate when none is given).

review may import api and rules only; server and certs may add kopf and cryptography. Nothing here imports
controller or cli.
"""
