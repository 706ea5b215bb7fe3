"""What the kopf handlers in ``main.py`` and the periodic jobs (``controller/periodic.py``)
delegate to: the reconcile (create, update, resume, resync, drift repair, ScalingPolicy
propagation; there is no delete handler, garbage collection deletes the children) and the
status jobs (children and Prometheus into ``status``)."""
