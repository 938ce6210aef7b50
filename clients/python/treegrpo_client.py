"""A client for `treegrpo serve`: fork sessions, tree rollouts, token-level
generation and weight reload, on the Python standard library alone.

    from treegrpo_client import Client

    client = Client("http://127.0.0.1:8000")
    with client.session(messages=[{"role": "user", "content": "Name a river."}]) as s:
        step = s.generate(max_new_tokens=32, temperature=0.7)
        branches = s.fork(2)            # share s's computed prefix: nothing recomputed
        for b in branches:
            print(b.generate(max_new_tokens=16)["text"])
            b.close()

The OpenAI-compatible endpoints are best driven with the `openai` package itself
(`base_url=".../v1"`); this module covers what that package has no call for.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional


class ServerError(Exception):
    """A response with an error status: `status` is the HTTP code, `message` the
    server's explanation, `retry_after` its `Retry-After` (429 and 503)."""

    def __init__(self, status: int, message: str, retry_after: Optional[float] = None):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after


class Client:
    """One server. `api_key` is sent as `Authorization: Bearer KEY`."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: Optional[str] = None,
                 timeout: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
        """Sends one request; returns the decoded JSON (or text) body."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
                kind = resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                message = json.loads(raw).get("error", {}).get("message") or raw.decode()
            except ValueError:
                message = raw.decode(errors="replace")
            retry = e.headers.get("Retry-After")
            raise ServerError(e.code, message, float(retry) if retry else None) from None
        return json.loads(raw) if "json" in kind else raw.decode()

    # --- sessions -----------------------------------------------------------------

    def session(self, input_ids: Optional[List[int]] = None, text: Optional[str] = None,
                messages: Optional[List[Dict[str, str]]] = None) -> "Session":
        """A new fork session from token ids, text (special tokens parsed) or chat
        messages (rendered with the model's template, ready for the reply)."""
        body: Dict[str, Any] = {}
        if input_ids is not None:
            body["input_ids"] = list(input_ids)
        if text is not None:
            body["text"] = text
        if messages is not None:
            body["messages"] = messages
        made = self.request("POST", "/v1/sessions", body)
        return Session(self, made["session_id"], made["length"])

    # --- generation, rollouts, weights --------------------------------------------

    def generate(self, input_ids: Optional[List[int]] = None, text: Optional[str] = None,
                 return_logprob: bool = True, **sampling_params: Any) -> Any:
        """SGLang's `/generate`: `output_ids`, `text` and `meta_info`."""
        body: Dict[str, Any] = {"sampling_params": sampling_params, "return_logprob": return_logprob}
        if input_ids is not None:
            body["input_ids"] = list(input_ids)
        if text is not None:
            body["text"] = text
        return self.request("POST", "/generate", body)

    def rollouts(self, task: str, prompts: Optional[int] = None,
                 sample_ids: Optional[List[str]] = None, **config: Any) -> Dict[str, Any]:
        """Tree (or chain) rollouts on a built-in task: `trajectories`, `forests` and
        `summary` in the export schema of `treegrpo rollout --out`."""
        body: Dict[str, Any] = {"task": task, **config}
        if prompts is not None:
            body["prompts"] = prompts
        if sample_ids is not None:
            body["sample_ids"] = sample_ids
        return self.request("POST", "/v1/rollouts", body)

    def update_weights_from_disk(self, model_path: str) -> Dict[str, Any]:
        """Serve a checkpoint's weights from now on; returns the new weight version."""
        return self.request("POST", "/update_weights_from_disk", {"model_path": model_path})

    def flush_cache(self) -> Dict[str, Any]:
        return self.request("POST", "/flush_cache", {})

    def health(self) -> Dict[str, Any]:
        return self.request("GET", "/health")

    def metrics(self) -> str:
        return self.request("GET", "/metrics")


class Session:
    """One engine sequence driven step by step. Use it as a context manager, or call
    `close()`: an idle session also closes by itself after the server's TTL."""

    def __init__(self, client: Client, session_id: str, length: int):
        self.client = client
        self.id = session_id
        self.length = length

    def generate(self, **sampling_params: Any) -> Dict[str, Any]:
        """Generates; the tokens join the session. Returns `output_ids`, `logprobs`,
        `text`, `finish_reason`, `length`, `weight_version`."""
        out = self.client.request("POST", f"/v1/sessions/{self.id}/generate",
                                  {"sampling_params": sampling_params})
        self.length = out["length"]
        return out

    def append(self, input_ids: Optional[List[int]] = None, text: Optional[str] = None) -> int:
        """Adds tokens (an observation); returns the session's length."""
        body: Dict[str, Any] = {}
        if input_ids is not None:
            body["input_ids"] = list(input_ids)
        if text is not None:
            body["text"] = text
        self.length = self.client.request("POST", f"/v1/sessions/{self.id}/append", body)["length"]
        return self.length

    def fork(self, n: int = 1) -> List["Session"]:
        """`n` sessions sharing this one's computed prefix."""
        ids = self.client.request("POST", f"/v1/sessions/{self.id}/fork", {"n": n})["session_ids"]
        return [Session(self.client, i, self.length) for i in ids]

    def info(self) -> Dict[str, Any]:
        """`length`, `weight_version`, `input_ids` (every token) and `busy`."""
        return self.client.request("GET", f"/v1/sessions/{self.id}")

    def close(self) -> None:
        try:
            self.client.request("DELETE", f"/v1/sessions/{self.id}")
        except ServerError as e:
            if e.status != 404:  # already closed or expired
                raise

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
