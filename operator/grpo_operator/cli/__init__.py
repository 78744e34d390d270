"""Entrypoints, thin: `grpojob` (check, render, run --local, crd), `grpo-operator` (the controller and webhook
process) and their helpers (documents: reading YAML files; local_run: torchrun on this machine).

May import every other layer; nothing imports cli.
"""
