"""The operator's I/O: kopf registration, the reconciler, the pod watch, the progress scraper, the API client,
Events, metrics and settings. Every decision is lifecycle.decide(); this package observes and carries it out.

May import every pure layer (api, rules, render, lifecycle), webhook (to serve it), kopf and aiohttp; nothing from
cli.
"""
