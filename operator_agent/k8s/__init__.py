"""Kubernetes objects the operator creates, built by pure functions (see ``operator_agent.k8s.manifests``)."""
