"""The error codes of the attach command (``manage.py attach_cluster``): its own refusals, printed by the command;
the control plane's answers it reports are the API's (docs/errors.md)."""

from __future__ import annotations

ATTACH_INPUT_INVALID = "attach_input_invalid"
"""A flag or a values file cannot be used (or the cluster's Kubernetes version cannot pin an image)."""
