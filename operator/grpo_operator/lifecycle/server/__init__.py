"""vLLM server mode (spec.vllm.mode: server), lifecycle side, in one place. decide() reaches it through two entry
points: the step `first.server_first` (listed in lifecycle/decision.py STEPS) and the restart hook
`keep.restart_keeping` (lifecycle/restart.py restart_for). Its render side is render/vllm_server.py (the server pod)
and render/manifests.py (its Service; outside the trainers' gang); the controller's is controller/engine_probe.py.

    order   the rules, pure: server first, the start-up deadline (plan), a wedged server (server_wedged), the
            engine probe's request and verdict, the reasons
    first   the step server_first: the server pods created first, the trainers once every one is Ready
    keep    a healthy server kept across a trainer restart (status.vllmServerAttempt) and its engine probe before
            the next trainers (verify_kept)

The modules are imported by name (lifecycle/draft.py imports order; first and keep import draft).
"""
