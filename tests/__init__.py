"""The test suite, by tier (docs/testing.md): unit (pure, seconds), integration (kmock, a real control plane, the CEL
server, helm template), e2e (real training, the chart installed, images, a real node). Shared helpers and fixtures
live in tests.support."""
