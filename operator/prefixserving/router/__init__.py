"""The prefix router: prefix hashing of request bodies, routing policies (shared with the
cluster simulator), backend discovery and load scraping, the streaming proxy, hot prefixes for
warm-up, prefix hygiene, and the HTTP app. Never imports kopf or vLLM."""
