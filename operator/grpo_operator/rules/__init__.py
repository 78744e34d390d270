"""The rules a GRPOJob must satisfy: TRL's batch arithmetic (batch), nodes × processes per node (topology) and the
one validator behind the webhook, the operator and `grpojob check` (validation).

Pure: may import api, pydantic and the standard library; nothing from render, lifecycle, controller, webhook, cli,
kopf or kubernetes.
"""
