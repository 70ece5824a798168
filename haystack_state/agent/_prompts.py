"""
The Agent's ``system_prompt`` and ``user_prompt``: Jinja2 templates rendered from ``run`` keyword arguments with
haystack's ``ChatPromptBuilder`` (sandboxed), as haystack-ai's Agent renders them.

A prompt is a plain string template (``"Answer in {{ language }}"``) or one explicit message block
(``{% message role="user" %}...{% endmessage %}``). Its variables become inputs of the Agent; ``required_variables``
says which must be given (``"*"``: all of them, the default; a list; or None: none, missing ones render empty).
A prompt without variables is rendered once, when the Agent is built.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from haystack.components.builders import ChatPromptBuilder
from haystack.dataclasses import ChatMessage

__all__ = ["PromptTemplates", "RequiredVariables"]

RequiredVariables = list[str] | Literal["*"] | None

_MESSAGE_BLOCK = re.compile(r"\{%\s*message\s")
_BLOCK_ROLE = re.compile(r"""\{%\s*message\s+role\s*=\s*["'](\w+)["']""")


def _template(prompt: str, role: str, label: str) -> str:
    """The ChatPromptBuilder template for a prompt: its own message block, checked, or the text wrapped in one."""
    blocks = _MESSAGE_BLOCK.findall(prompt)
    if not blocks:
        return f'{{% message role="{role}" %}}{prompt}{{% endmessage %}}'
    if len(blocks) > 1:
        raise ValueError(f"{label} must define exactly one message block, found {len(blocks)}.")
    roles = _BLOCK_ROLE.findall(prompt)
    if roles and roles[0] != role:
        raise ValueError(f"{label} message block must have role '{role}', found role '{roles[0]}'.")
    return prompt


class _Prompt:
    """One prompt: its builder, its variables, and its rendering when it has none."""

    def __init__(self, prompt: str, role: str, label: str) -> None:
        self.role = role
        self.label = label
        self.builder = ChatPromptBuilder(template=_template(prompt, role, label), required_variables=[])
        self.variables: list[str] = list(self.builder.variables)
        self.required: list[str] = []
        self.fixed: ChatMessage | None = self._render({}) if not self.variables else None

    def _render(self, values: Mapping[str, Any]) -> ChatMessage:
        messages = self.builder.run(**values)["prompt"]
        if len(messages) != 1:
            raise ValueError(f"{self.label} must render to exactly one {self.role} message, got {len(messages)}.")
        if not messages[0].is_from(self.role):
            raise ValueError(f"{self.label} must render to a {self.role} message, got role '{messages[0].role.value}'.")
        return messages[0]

    def render(self, values: Mapping[str, Any]) -> ChatMessage:
        if self.fixed is not None:
            return self.fixed
        missing = [name for name in self.required if name not in values]
        if missing:
            raise ValueError(
                f"Missing required input variables in {self.label}: {missing}. Pass them to run() "
                f"(e.g. agent.run(messages, {missing[0]}=...)). Its variables: {self.variables}; required: "
                f"{self.required}."
            )
        return self._render({name: values[name] for name in self.variables if name in values})


class PromptTemplates:
    """
    The Agent's prompts.

    :param system_prompt: The system prompt template, or None.
    :param user_prompt: The user prompt template, or None: rendered and appended to the run's messages.
    :param required_variables: Which variables must be given to ``run``: ``"*"`` (all), a list, or None (none).
    :raises ValueError: For a prompt with several message blocks or the wrong role.
    """

    def __init__(
        self, system_prompt: str | None, user_prompt: str | None, required_variables: RequiredVariables
    ) -> None:
        self.system = _Prompt(system_prompt, "system", "system_prompt") if system_prompt is not None else None
        self.user = _Prompt(user_prompt, "user", "user_prompt") if user_prompt is not None else None
        prompts = [prompt for prompt in (self.system, self.user) if prompt is not None]
        for prompt in prompts:
            if required_variables == "*":
                prompt.required = list(prompt.variables)
            elif isinstance(required_variables, list):
                prompt.required = [name for name in required_variables if name in prompt.variables]
        #: Every variable, with the prompts it appears in.
        self.variables: dict[str, list[str]] = {}
        for prompt in prompts:
            for name in prompt.variables:
                self.variables.setdefault(name, []).append(prompt.label)
        self.required: set[str] = {name for prompt in prompts for name in prompt.required}

    def render(self, values: Mapping[str, Any]) -> tuple[ChatMessage | None, ChatMessage | None]:
        """
        Render both prompts.

        :param values: The ``run`` keyword arguments.
        :returns: The system message and the user message (None for a prompt not given).
        :raises ValueError: If a required variable is missing (the message names it and the prompt).
        """
        system = self.system.render(values) if self.system is not None else None
        user = self.user.render(values) if self.user is not None else None
        return system, user
