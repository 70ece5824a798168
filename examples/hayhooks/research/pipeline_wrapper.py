"""The demo's research agent as a Hayhooks deployment, named after its folder (research); its threads in research.db."""

from haystack_state import SQLiteCheckpointer
from haystack_state.demo import research_agent
from haystack_state.hayhooks import agent_wrapper

PipelineWrapper = agent_wrapper(lambda: research_agent(SQLiteCheckpointer("research.db")))
