"""The operator console: the Django admin site, titled for gShare."""
