"""The endpoint picker: ``prefixserving router --mode endpoint-picker``, an Envoy ``ext_proc``
gRPC service that speaks the Endpoint Picker protocol of the Gateway API Inference Extension,
so any inference gateway (Istio, kgateway, Agentgateway, Envoy Gateway, NGINX Gateway Fabric,
GKE) sends each request of an ``InferencePool`` to the engine the router's policy picks.

- ``protocol.py``: the protocol's names and the ext_proc messages it answers with.
- ``stream.py``: one ``Process`` stream (one HTTP request): read the headers and body, pick
  with the router's key, policy and loads, answer, follow the endpoint that served.
- ``server.py``: the gRPC server (ext_proc and health services, TLS) beside the router's HTTP
  port (metrics, hot prefixes for warm-up, hygiene, health).
"""
