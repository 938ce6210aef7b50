"""Type stubs of the compiled module ``treegrpo._treegrpo`` (see ``python/src``)."""

from os import PathLike
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .adapters import TokenOutput

__version__: str

Prompt = Union[str, Sequence[int]]

class Generation:
    """One finished generation."""

    token_ids: List[int]
    """The generated token ids (a stop token that ended it is not included)."""
    logprobs: List[float]
    """Natural-log probability of each token under the sampling distribution."""
    finish_reason: str
    """``"stop"`` (a stop token or string) or ``"length"`` (max_tokens, the context)."""
    stop_reason: str
    """``stop_token``, ``stop_string``, ``max_tokens`` or ``context_full``."""
    weight_version: int
    """The weights every token was sampled under."""
    text: str
    """The token ids decoded."""
    top_logprobs: List[List[Tuple[int, float]]]
    """With ``logprobs=N``: each token's N most likely ``(token_id, logprob)``
    alternatives under the distribution ``logprobs`` are taken from (else empty)."""
    def to_dict(self) -> Dict[str, Any]: ...
    def __len__(self) -> int: ...

class Tokenizer:
    """The model's tokenizer and chat template."""

    vocab_size: int
    eos_token_ids: List[int]
    bos_token_id: Optional[int]
    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        """Token ids of ``text``; with ``add_special_tokens`` a BOS first when the
        model wants one and special-token text becomes its token."""
    def decode(self, token_ids: Sequence[int]) -> str: ...
    def apply_chat_template(
        self,
        messages: Sequence[Dict[str, str]],
        add_generation_prompt: bool = True,
        tokenize: bool = True,
    ) -> Union[List[int], str]:
        """The model's own chat template applied to ``messages``."""

class Session:
    """One sequence kept in the engine: generate, append, fork. Close it (or use it
    as a context manager); a collected session is freed."""

    tokens: List[int]
    closed: bool
    def generate(
        self,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: Optional[float] = None,
        top_k: Optional[int] = None,
        stop: Union[None, str, Sequence[str]] = None,
        seed: Optional[int] = None,
        *,
        min_p: Optional[float] = None,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logprobs: int = 0,
        min_tokens: int = 0,
    ) -> Generation:
        """Generates from the session's tokens; the tokens become part of it."""
    def append(self, token_ids: Sequence[int]) -> None: ...
    def fork(self, n: int = 1) -> List["Session"]:
        """``n`` sessions sharing this one's cached prefix (nothing recomputed)."""
    def close(self) -> None: ...
    def __enter__(self) -> "Session": ...
    def __exit__(self, *exc: Any) -> bool: ...

class Engine:
    """The inference engine: a model, its paged, forkable KV cache, and the scheduler
    batching every sequence's next token into one forward."""

    model_path: str
    tokenizer: Tokenizer
    weight_version: int
    def __init__(
        self,
        model: Union[None, str, PathLike[str]] = None,
        kv_mib: int = 1024,
        max_batch_seqs: int = 64,
        seed: int = 0,
    ) -> None:
        """``model``: a .gguf file or an HF folder; None: the default model, fetched
        on first use as the CLI does."""
    def generate(
        self,
        prompts: Union[Prompt, Sequence[Prompt]],
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: Optional[float] = None,
        top_k: Optional[int] = None,
        stop: Union[None, str, Sequence[str]] = None,
        seed: Optional[int] = None,
        *,
        min_p: Optional[float] = None,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logprobs: int = 0,
        min_tokens: int = 0,
    ) -> List[Generation]:
        """Completes every prompt (texts or token-id lists) in one batch. Sampling
        reads as vLLM's: ``temperature`` 0 is greedy, ``top_k`` -1 or 0, ``top_p`` 1
        and ``min_p`` 0 are off; a value out of range is a ``ValueError`` in the
        words the CLI and the server use, never coerced. vLLM's
        extensions: ``min_p``, the three penalties (they shape the choice; ``logprobs``
        stay the model's), ``logprobs=N`` alternatives per token (up to 20),
        ``min_tokens`` (fewest tokens before a stop token or string may end it)."""
    def agenerate(
        self,
        prompt_ids: Sequence[int],
        sampling_params: Optional[Dict[str, Any]] = None,
        request_id: Optional[str] = None,
        *,
        image_data: None = None,
        video_data: None = None,
    ) -> Awaitable[TokenOutput]:
        """verl 0.9.1's rollout-server ``generate`` (positional, or all by keyword as
        verl's client calls it): a :class:`treegrpo.adapters.TokenOutput` with
        ``stop_reason="completed"`` and ``extra_fields`` ``{"weight_version",
        "finish_reason"}``. The request id seeds the sampling. ``image_data`` and
        ``video_data`` other than None are a ``ValueError`` (text-only engine)."""
    def session(self, prompt_ids: Prompt) -> Session: ...
    def load_weights(self, path: Union[str, PathLike[str]], version: Optional[int] = None) -> int:
        """Serves a checkpoint's weights from now on; returns the new version
        (``version`` when given, which must be above the served one; else the next)."""
    def load_state_dict(self, state: Mapping[str, Any], version: Optional[int] = None) -> int:
        """Serves a state dict's weights from now on (no file); returns the new version
        as :meth:`load_weights` does. ``state``: HF parameter names
        (``model.layers.0.self_attn.q_proj.weight``, what a transformers model's
        ``state_dict()`` holds) to torch tensors (float32, bfloat16, float16, float64;
        any device, copied to the CPU) or numpy arrays (float32, float16, float64,
        ml_dtypes' bfloat16), read from their memory. A tied ``lm_head.weight`` equal
        to the embedding is accepted. An unknown or missing name, a wrong shape or dtype
        is a ``ValueError`` naming the tensor, and the engine serves on as before. An
        engine started on a llama GGUF serves HF-layout weights with HF's RoPE pairing."""
    def reset_prefix_cache(self) -> None: ...
    def stats(self) -> Dict[str, Any]:
        """Counters (prefilled, decoded, reused, computed), KV pool, sequences,
        weight version, step latencies."""

def rollout(
    engine: Engine,
    env: Any,
    samples: Any,
    *,
    trees: int = 2,
    expand: int = 2,
    rounds: int = 1,
    keep: Optional[int] = None,
    select: str = "paper",
    chains: Optional[int] = None,
    seed: int = 0,
    advantage: Optional[str] = None,
    max_turns: int = 3,
    max_step_tokens: int = 256,
    temperature: float = 1.0,
    branch_sampling: Optional[str] = None,
    token_budget: Optional[int] = None,
    max_concurrent_prompts: int = 16,
    env_timeout: float = 30.0,
    prompt_offset: int = 0,
    event_loop: Any = None,
    progress: Optional[Callable[[Dict[str, Any]], None]] = None,
) -> Dict[str, Any]: ...
def update(
    model_path: Optional[str], trajectories: Any, out_dir: str, **options: Any
) -> Dict[str, Any]: ...

class Trainer:
    """The training loop (see ``treegrpo.Trainer``, which wraps this class)."""

    step: int
    config: str  # the resolved settings as JSON (as `treegrpo train --print-config`)
    def __init__(self, engine: Engine, env: Any, out_dir: str, **options: Any) -> None: ...
    def run(self, progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> List[Dict[str, Any]]: ...
    def resume(self) -> int: ...
