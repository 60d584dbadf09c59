"""Kubernetes objects the operator creates, built by pure functions (see ``operator_agent.manifests.session``)."""
