"""The PrefixServing and ScalingPolicy API: pydantic models, defaults, validation, conditions,
derived names, and the CRDs generated from the models."""
