"""Install and GitOps tests: the Helm chart, its RBAC on a real RBAC API server, the CRD's CEL rules."""
