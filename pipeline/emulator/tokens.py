"""Token counting and filler output text.

A chat prompt's tokens are, for each message, the tokens of "<role>:" then the tokens of its content,
then the tokens of "assistant:" (the generation prompt). Messages are encoded one by one and the ids
concatenated, so the next turn's prompt (earlier messages + the assistant's reply + a new message)
starts with exactly this turn's prompt + reply: the prefix cache sees real chat-template behaviour.

Agentic clients resend the whole conversation every turn, so long messages' ids are memoised (LRU,
MEMO_TOKENS ids in all): a turn tokenizes only its new messages, as a real engine's radix cache would
skip recomputing them. Only the count and ids matter, so this changes no result.

Each generated token is one vocab word sent as " word": a client re-tokenizing the concatenated text
gets one token per word (checked for every word when the vocab is loaded), so its count equals usage.
"""
from __future__ import annotations

import json
import random
import re
import threading
import zlib
from array import array
from collections import OrderedDict
from pathlib import Path
from typing import Any

# Whitespace mode's output words (no tokenizer): ordinary words, one token each by construction.
FALLBACK_WORDS = (
    "the of and to in is was for on that with as by at from it his an were are which this be or had "
    "not but first one their its new after who they have her she two been other when there all during "
    "into school time may years more most only over city some world would where later up such used many "
    "can state about national out known university united then made three both since under between "
    "while well through part being most system several team second found however north company these "
    "film early also high like south before west called because long house including river side small"
).split()
_WORD = re.compile(r"^[a-z]{2,12}$")
_MARKERS = ("\u0120", "\u2581")  # byte-level BPE's space mark, SentencePiece's space mark
MAX_OUTPUT_WORDS = 2048
MEMO_MIN_CHARS = 4096        # shorter messages are cheaper to encode than to look up
MEMO_TOKENS = 8_000_000      # ids kept by the message memo (4 bytes each)


class TokenizerError(ValueError):
    pass


class Tokens:
    """Counts and makes tokens; `ids` feed the prefix cache's block hashes."""

    name = "whitespace"
    vocab_size = 1 << 31  # encode()'s ids are 31-bit hashes

    def __init__(self, seed: int = 0):
        self._role_ids: dict[str, list[int]] = {}
        self._memo: OrderedDict[str, array] = OrderedDict()
        self._memo_tokens = 0
        self._lock = threading.Lock()  # chat_ids runs in worker threads for long prompts
        self.words = list(FALLBACK_WORDS)
        self.word_ids = [self._word_id(w) for w in self.words]
        self._set_texts()
        self.rng = random.Random(seed)

    def encode(self, text: str) -> list[int]:
        # a word's id is the same in every process (str's hash() is salted per process, and the arms are two
        # processes that must see one prompt as the same ids); & keeps it in array("i")'s 32 bits for the memo
        return [zlib.crc32(w) & 0x7FFFFFFF for w in map(str.encode, text.split())]

    def _set_texts(self) -> None:
        self.word_texts = [" " + w for w in self.words]
        self.word_json = [json.dumps(t) for t in self.word_texts]  # escaped once, streamed many times

    def _word_id(self, word: str) -> int:
        return zlib.crc32(word.encode()) & 0x7FFFFFFF

    def info(self) -> dict[str, Any]:
        return {"mode": self.name, "output_words": len(self.words)}

    def chat_ids(self, messages: list[tuple[str, str]]) -> list[int]:
        ids: list[int] = []
        for role, content in messages:
            ids += self._role(role)
            ids += self._encode_memo(content)
        return ids + self._role("assistant")

    def _encode_memo(self, text: str) -> list[int]:
        if len(text) < MEMO_MIN_CHARS:
            return self.encode(text)
        with self._lock:
            hit = self._memo.get(text)
            if hit is not None:
                self._memo.move_to_end(text)
                return hit.tolist()
        ids = self.encode(text)
        with self._lock:
            if text not in self._memo:
                self._memo[text] = array("i", ids)
                self._memo_tokens += len(ids)
            while self._memo_tokens > MEMO_TOKENS and self._memo:
                self._memo_tokens -= len(self._memo.popitem(last=False)[1])
        return ids

    def _role(self, role: str) -> list[int]:
        if role not in self._role_ids:
            self._role_ids[role] = self.encode(f"{role}:")
        return self._role_ids[role]

    def next_word(self) -> int:
        """Index of a random output word (seeded): word_ids[i] is its id, word_texts[i] its text."""
        return self.rng.randrange(len(self.words))

    def output_words(self, prompt_hash: int, flip_rate: float = 0.0) -> "OutputWords":
        """A request's output word stream: a function of its prompt alone (see OutputWords)."""
        return OutputWords(prompt_hash, len(self.words), flip_rate)


_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread 64-bit hash (no Random object per token)."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


class OutputWords:
    """One request's output words, as greedy decoding would make them: each word is a function of the
    prompt and of every word before it, so two arms whose kernels compute the same logits answer word
    for word alike, whatever their timing or batch mates.

    `flip_rate` stands in for a kernel whose numerics differ: each word is, with that probability, replaced
    by another one (the argmax moved). The draw is seeded by the prompt, so a perturbed run is
    reproducible, and since later words depend on earlier ones the outputs stay apart from there on.

    `logprob` is the last word's log-probability as a server would report it: a function of the same state
    (so equal in two exact arms), moved by up to half of `flip_rate` nats where the numerics differ, as a lossy
    kernel moves logits without always moving an argmax.
    """

    def __init__(self, prompt_hash: int, n_words: int, flip_rate: float = 0.0):
        self.state = _mix(prompt_hash & _MASK)
        self.flip_state = _mix(self.state ^ 0x5EED)
        self.n_words = n_words
        self.flip_threshold = int(flip_rate * (1 << 64))
        self.flip_rate = flip_rate
        self.logprob = 0.0

    def next(self) -> int:
        self.state = _mix(self.state + 0x9E3779B97F4A7C15)
        i = self.state % self.n_words
        self.logprob = -((self.state >> 20) % 4096) / 1024  # in (-4, 0]
        if self.flip_threshold:
            self.flip_state = _mix(self.flip_state + 0x9E3779B97F4A7C15)
            self.logprob = min(0.0, self.logprob + self.flip_rate * ((self.flip_state >> 40) / (1 << 24) - 0.5))
            if self.flip_state < self.flip_threshold:
                i = (i + 1 + self.flip_state % (self.n_words - 1)) % self.n_words
        self.state ^= i  # the word taken feeds the next one, as a decoded token feeds the next step
        return i


class HfTokens(Tokens):
    """A HF tokenizer directory, loaded with `tokenizers` from tokenizer.json (fast, no transformers)."""

    name = "hf"

    def __init__(self, directory: str, seed: int = 0):
        from tokenizers import Tokenizer

        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"tokenizer: {directory!r} has no tokenizer.json; give a HF tokenizer directory")
        self.directory = directory
        self.tok = Tokenizer.from_file(str(path))
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self._encode_batch = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)  # fast: no offsets
        super().__init__(seed)
        self.words, self.word_ids = self._output_words(seed)
        self._set_texts()

    def encode(self, text: str) -> list[int]:
        # The batch call, not Tokenizer.encode: encode holds the GIL (0.8 s on a 200k-token prompt, measured),
        # which froze the engine loop mid-cycle from the tokenizing thread; the batch calls release it.
        return self._encode_batch([text], add_special_tokens=False)[0].ids

    def info(self) -> dict[str, Any]:
        return {"mode": self.name, "path": self.directory, "vocab_size": self.tok.get_vocab_size(),
                "output_words": len(self.words)}

    def _output_words(self, seed: int) -> tuple[list[str], list[int]]:
        """Ordinary lowercase words w whose " w" encodes to exactly one token, chosen with a seed."""
        vocab = self.tok.get_vocab(with_added_tokens=False)
        cands = sorted({tok.lstrip("".join(_MARKERS)) for tok in vocab} - {""})
        cands = [w for w in cands if _WORD.match(w)]
        random.Random(seed).shuffle(cands)
        cands = cands[: 4 * MAX_OUTPUT_WORDS]
        encs = self.tok.encode_batch([" " + w for w in cands], add_special_tokens=False)
        chosen = [(w, e.ids[0]) for w, e in zip(cands, encs) if len(e.ids) == 1][:MAX_OUTPUT_WORDS]
        if len(chosen) < 8:
            raise TokenizerError(f"tokenizer: {self.directory!r} has {len(chosen)} ordinary single-token words "
                                 "(need >= 8 to make output text)")
        return [w for w, _ in chosen], [i for _, i in chosen]


def load_tokens(directory: str | None, seed: int = 0) -> Tokens:
    return HfTokens(directory, seed) if directory else Tokens(seed)
