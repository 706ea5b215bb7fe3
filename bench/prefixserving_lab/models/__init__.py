"""What the simulations and the replay model: :mod:`.replica` (one engine's cache and service
time), :mod:`.cluster` (the router in front of replicas, as discrete events), :mod:`.fleet`
(pods starting, warming and draining), :mod:`.scaling` (the HPA's control loop),
:mod:`.rollout` (a rolling update), :mod:`.peer_routers` (other projects' routing
algorithms), :mod:`.cost` (the replay's step cost), :mod:`.replay_engine` (vLLM's scheduler
built with no model) and :mod:`.schedulers` (PEEK's published alternatives inside vLLM)."""
