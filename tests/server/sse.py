"""Reading a server-sent event stream as the OpenAI client does."""

from __future__ import annotations

import json

import httpx

DONE = "[DONE]"


def read_events(response: httpx.Response) -> list[dict | str]:
    """The `data:` payloads of a streamed response, JSON-decoded; the final `[DONE]` stays a string."""
    events: list[dict | str] = []
    for block in response.text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), f"not an SSE data line: {block!r}"
        payload = block.removeprefix("data: ")
        events.append(payload if payload == DONE else json.loads(payload))
    return events


def stream(client: httpx.Client, path: str, body: dict) -> list[dict | str]:
    response = client.post(path, json={**body, "stream": True})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return read_events(response)
