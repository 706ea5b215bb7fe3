"""The operator: thin kopf handlers (``main.py``) over plain reconcile and status functions
(``handlers/``), the periodic jobs that run without kopf timers (``periodic.py``), operator
settings, and the only module that talks to the Kubernetes API server (``kube.py``)."""
