"""grpo-operator: a Kubernetes operator for GRPO post-training jobs (TRL GRPOTrainer + vLLM under torchrun).

One sub-package per layer; each says in its docstring what it may import (docs/architecture.md has the map):

    api         pure   GRPOJob models (spec, status, phases, conditions, reasons), CRD + CEL generation, TRL fields
    rules       pure   TRL's batch rule, topology, the one validator
    render      pure   spec → every child object
    lifecycle   pure   (job, pods, now) → status and actions
    webhook     review pure; server + certificates
    controller  I/O    kopf registration, reconciler, pod watch, progress scraper, API client, events, metrics
    cli         I/O    grpojob and grpo-operator entrypoints (thin)

Pure layers import nothing from kopf, the kubernetes client, controller, webhook's server or cli; nothing imports
upward (tests/unit/test_layers.py checks it).
"""
