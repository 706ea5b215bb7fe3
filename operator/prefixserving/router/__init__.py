"""The prefix router: prefix block keys, routing policies, backend discovery and load scraping,
the streaming proxy and its HTTP app. Never imports kopf."""
