"""gShare control-plane settings: ``base`` plus one small fragment per integration."""

from .base import *  # noqa: F401,F403
from .billing import *  # noqa: F401,F403
from .celery import *  # noqa: F401,F403
from .console import *  # noqa: F401,F403
from .jwt import *  # noqa: F401,F403
from .logging import *  # noqa: F401,F403
from .metrics import *  # noqa: F401,F403
from .operator_tokens import *  # noqa: F401,F403
from .storage import *  # noqa: F401,F403
