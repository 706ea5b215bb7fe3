"""Autoscaling and monitoring: the PromQL the scalers, alerts, dashboard and status run
(``promql.py``), the alert rules, the Grafana dashboard and the chart's monitoring files, and
the HPA algorithm the scaling simulator runs (``hpa.py``). The merge of a PrefixServing's
autoscaling block with its ScalingPolicy is ``api/scaling.py``."""
