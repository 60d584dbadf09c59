"""The one ``environ.Env`` instance every settings fragment reads from."""

import environ

env = environ.Env()

#: True in production: missing secrets then fail at boot instead of falling back to local defaults.
PRODUCTION = env.bool("GSHARE_PRODUCTION", default=False)
