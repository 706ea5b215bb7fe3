"""Autoscaling: the PromQL the scalers run, the HPA algorithm used by the simulator, and the
resolution of a PrefixServing's autoscaling block against a referenced ScalingPolicy."""
