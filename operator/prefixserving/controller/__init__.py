"""The operator: thin kopf handlers (``main.py``) over plain reconcile and status functions,
operator settings, and the only module that talks to the Kubernetes API (``kube.py``)."""
