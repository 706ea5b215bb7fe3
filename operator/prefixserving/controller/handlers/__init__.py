"""What the kopf handlers in ``main.py`` delegate to: the reconcile (create, update, resume,
delete, drift repair, ScalingPolicy propagation) and the status timers."""
