"""Reading a server-sent event stream as the OpenAI client does."""

from __future__ import annotations

import json
from collections.abc import Iterable

import httpx

DONE = "[DONE]"


def parse(lines: Iterable[str]) -> list[dict | str]:
    """The `data:` payloads of SSE lines, JSON-decoded; the final `[DONE]` stays a string."""
    events: list[dict | str] = []
    for line in lines:
        if not line:
            continue  # the blank line that ends each event
        assert line.startswith("data: "), f"not an SSE data line: {line!r}"
        payload = line.removeprefix("data: ")
        events.append(payload if payload == DONE else json.loads(payload))
    return events


def read_events(response: httpx.Response) -> list[dict | str]:
    """The events of a whole streamed response; each is one `data:` line and a blank line."""
    assert response.text.endswith("\n\n")
    return parse(response.text.split("\n"))


def tokens(events: list[dict | str]) -> list[int]:
    """All token ids of a stream, from the `token_ids` of its chunks."""
    return [t for e in events if isinstance(e, dict) and e.get("choices") for t in e["choices"][0]["token_ids"]]


def stream(client: httpx.Client, path: str, body: dict) -> list[dict | str]:
    response = client.post(path, json={**body, "stream": True})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return read_events(response)
