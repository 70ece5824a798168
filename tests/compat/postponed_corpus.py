"""
Corpus entries written with postponed annotations (``from __future__ import annotations``): every annotation is a
string, which haystack-ai and haystack-state both resolve.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from haystack import component

from compat.schema_corpus import Case, Unit


@dataclasses.dataclass
class Street:
    """
    A street.

    :param name: The street's name.
    """

    name: str
    number: int | None = None


@dataclasses.dataclass
class Parcel:
    """A parcel to deliver."""

    weight: float
    to: Street


def postponed_function(
    city: Annotated[str, "The city"], unit: Unit = Unit.CELSIUS, mode: Literal["a", "b"] = "a", to: Street | None = None
) -> str:
    """Postponed annotations everywhere."""
    return city


@component
class ParcelSender:
    """Send a parcel."""

    @component.output_types(sent=bool)
    def run(self, parcel: Parcel, express: bool = False) -> dict[str, Any]:
        """
        Send a parcel.

        :param parcel: What to send.
        """
        return {"sent": parcel.to.name != ""}


POSTPONED_CASES: list[Case] = [
    Case(
        "postponed_function",
        "function",
        lambda: postponed_function,
        valid=({"city": "Oslo", "to": {"name": "Main"}},),
        invalid=(({"city": "Oslo", "to": {"number": 1}}, "to"),),
    ),
    Case(
        "postponed_dataclass_component",
        "component",
        ParcelSender,
        valid=({"parcel": {"weight": 1.5, "to": {"name": "Main", "number": 3}}},),
        invalid=(({"parcel": {"weight": 1.5, "to": {"number": 3}}}, "parcel.to"),),
        haystack_broken="haystack-ai hands a dataclass field's string annotation ('Street') to pydantic unresolved, "
        "in a module where the name is unknown, and raises SchemaGenerationError; we resolve it first",
        reference={
            "type": "object",
            "$defs": {
                "Parcel": {
                    "type": "object",
                    "properties": {
                        "weight": {"type": "number", "description": "Field 'weight' of 'Parcel'."},
                        "to": {"$ref": "#/$defs/Street", "description": "Field 'to' of 'Parcel'."},
                    },
                    "required": ["weight", "to"],
                },
                "Street": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "description": "The street's name."},
                        "number": {
                            "anyOf": [{"type": "integer"}, {"type": "null"}],
                            "default": None,
                            "description": "Field 'number' of 'Street'.",
                        },
                    },
                    "required": ["name"],
                },
            },
            "properties": {
                "parcel": {"$ref": "#/$defs/Parcel", "description": "What to send."},
                "express": {"type": "boolean", "default": False, "description": "Input 'express' for the component."},
            },
            "required": ["parcel"],
        },
    ),
]
