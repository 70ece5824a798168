"""Helpers of the durable-thread tests: a deterministic agent, a worker process, the backend fixture."""
