"""The fleet-wide queue (docs/sessions.md, "Waiting in the queue").

A request sent with ``"queue": true`` that nothing can host now is kept as a ``Queued`` session instead of being
refused (``sessions.create``); one that can never fit is refused with ``never_fits`` (``sessions.queue.fits``). The
queue's order is one rule (``order``); each pass (``admit``) plans the whole queue over the fleet (``snapshot``,
``plan``), starts the sessions the plan starts now (backfill included), drops those that waited too long or whose
owner can no longer pay, and writes every other queued session's position, estimated start, reason and alternatives
(``estimates``). A queued session holds no GPUs, credits or quota until it is admitted.
"""
