"""Spec → every child object of a GRPOJob (pods, headless Service, ConfigMap, vLLM server): pure and deterministic,
the same function behind the operator and `grpojob render`.

May import api, rules and the standard library; nothing from lifecycle, controller, webhook, cli, kopf or
kubernetes.
"""
