"""What one `saguaro bench --url ...` run sends: the server, the load points and the requests.

A *load point* is one open-loop request rate (Poisson arrivals; inf = all at once) or one closed-loop
concurrency; every point sends `num_prompts` requests, request i carrying prompt i of the selected set (cycled
when the set is shorter) with seed `seed + i`. `warmup` requests go first, one at a time and not recorded, with
the set's first prompts; the points' requests then take the prompts after them. `system_prompt` is sent with
every request (a chat's system message; before a completions prompt's text): a shared prefix, as a chat
application's. Saved as config.json of the run folder (never the API key).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import Enum

from saguaro.bench.client import ENDPOINTS
from saguaro.bench.config import known_fields
from saguaro.bench.prompts import PROMPT_ORDERS
from saguaro.bench.runfolder import CLIENT_KIND


class Load(Enum):
    RATE = "rate"  # open loop: Poisson arrivals, requests per second
    CONCURRENCY = "concurrency"  # closed loop: requests in flight


@dataclass(frozen=True)
class Point:
    load: Load
    value: float  # requests per second (inf allowed) or requests in flight

    @property
    def name(self) -> str:
        return f"{self.load.value}={self.value:g}"

    @property
    def rate_per_s(self) -> float | None:
        return self.value if self.load is Load.RATE else None

    @property
    def concurrency(self) -> int | None:
        return int(self.value) if self.load is Load.CONCURRENCY else None


def rate_json(rate: float | None) -> float | str | None:
    """A rate as JSON has it: a number, or "inf" (JSON has no infinity)."""
    return "inf" if rate is not None and math.isinf(rate) else rate


@dataclass(frozen=True)
class ClientConfig:
    url: str  # the server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1
    model: str | None = None  # None: the first model the server lists
    endpoint: str = "completions"  # or "chat"
    rates: tuple[float, ...] = ()  # requests per second (inf: all at once)
    concurrencies: tuple[int, ...] = ()
    num_prompts: int = 100  # requests per load point
    prompts: str = "spec_bench"
    categories: tuple[str, ...] = ()
    prompt_order: str = "round-robin"
    max_new_tokens: int = 128
    ignore_eos: bool = False
    temperature: float = 0.0
    seed: int = 0  # of the arrival times (numpy Generator) and, as seed + i, of request i's sampling
    timeout_s: float = 300.0  # per request, connection to last token
    deadline_s: float = 3600.0  # for the whole run: nothing is sent after it, and what is in flight is cut
    label: str | None = None  # the system's name in reports (e.g. ar, sd, ssd)
    system_prompt: str | None = None  # sent with every request (a chat's system message)
    warmup: int = 0  # requests sent one at a time before the first point, not recorded
    kind: str = CLIENT_KIND  # tells a client run folder from an engine bench's

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", self.url.rstrip("/"))
        for name in ("rates", "concurrencies", "categories"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "rates", tuple(float(r) for r in self.rates))
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(
                f"--url must be an http:// or https:// base URL such as http://127.0.0.1:8000/v1; got {self.url!r}"
            )
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {self.endpoint!r}; choose from {', '.join(ENDPOINTS)}")
        if bool(self.rates) == bool(self.concurrencies):
            raise ValueError(
                "give either --rate R ... (open loop, requests/s; inf = all at once) or --concurrency "
                "N ... (closed loop), not both and not neither"
            )
        if any(not r > 0 for r in self.rates):
            raise ValueError(f"request rates must be > 0 per second (or inf); got {list(self.rates)}")
        if any(not isinstance(c, int) or c < 1 for c in self.concurrencies):
            raise ValueError(f"concurrencies must be integers >= 1; got {list(self.concurrencies)}")
        if self.num_prompts < 1 or self.max_new_tokens < 1:
            raise ValueError("--num-prompts and --max-new-tokens must be >= 1")
        if self.warmup < 0:
            raise ValueError(f"--warmup-requests must be >= 0; got {self.warmup}")
        if self.system_prompt is not None and not self.system_prompt.strip():
            raise ValueError("the system prompt is empty: give a file with text, or drop --system-prompt")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy); got {self.temperature}")
        if not self.timeout_s > 0 or not self.deadline_s > 0:
            raise ValueError("--timeout (per request) and --deadline (whole run) must be > 0 seconds")
        if self.prompt_order not in PROMPT_ORDERS:
            raise ValueError(f"unknown prompt order {self.prompt_order!r}; choose from {', '.join(PROMPT_ORDERS)}")
        if self.kind != CLIENT_KIND:
            raise ValueError(f"a client config has kind {CLIENT_KIND!r}; got {self.kind!r}")

    def points(self) -> list[Point]:
        if self.rates:
            return [Point(Load.RATE, r) for r in self.rates]
        return [Point(Load.CONCURRENCY, c) for c in self.concurrencies]

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["rates"] = [rate_json(r) for r in self.rates]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ClientConfig:
        return cls(**{**known_fields(cls, data), "rates": tuple(float(r) for r in data.get("rates", ()))})
