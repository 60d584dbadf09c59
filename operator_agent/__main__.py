"""``python -m operator_agent``: run the gShare data-plane operator (see ``operator_agent.main``)."""

from operator_agent.main import main

raise SystemExit(main())
