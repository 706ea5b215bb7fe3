"""The PrefixServing and ScalingPolicy API, after KServe's split by concern: spec models
(``types.py``), status models (``status.py``), conditions (``lifecycle.py``), defaults
(``defaults.py``), the effective autoscaling (``scaling.py``), validation (``validation.py``),
derived names (``names.py``), and the CRDs generated from the models (``crd.py``). Imports
nothing from the operator, the router or the renderer."""
