"""One router per resource of the Agent Protocol: assistants, threads, runs. Routers only translate between HTTP and
the Agent, its checkpointer and the server's records."""
