"""Stored responses of the Responses API, in memory: `previous_response_id` continues a conversation from one, and
GET / DELETE /v1/responses/{id} read and remove one. The newest `capacity` are kept; each replica keeps its own
(behind several, continue on the replica that answered: its name is in X-Specedge-Replica)."""

from __future__ import annotations

from collections import OrderedDict

DEFAULT_CAPACITY = 256


class ResponseStore:
    """response id -> (the conversation up to and with that reply, as chat messages without the instructions, and
    the response object). Used from the event loop only."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[list[dict], dict]] = OrderedDict()

    def turns(self, response_id: str) -> list[dict] | None:
        """The conversation a response ended, or None where it is not (or no longer) kept."""
        if response_id not in self._items:
            return None
        self._items.move_to_end(response_id)
        return list(self._items[response_id][0])

    def save(self, response_id: str, turns: list[dict], response: dict) -> None:
        self._items[response_id] = (list(turns), response)
        self._items.move_to_end(response_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> dict | None:
        item = self._items.get(response_id)
        return None if item is None else item[1]

    def delete(self, response_id: str) -> bool:
        return self._items.pop(response_id, None) is not None
