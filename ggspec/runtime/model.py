"""An owning wrapper over `llama_model *`: load, metadata, tokenizer, free."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

from ggspec.errors import InputError, LlamaError
from ggspec.runtime.handle import OwnedHandle
from ggspec.native.bindings import last_log_error
from ggspec.native.bindings import load as load_bindings
from ggspec.runtime.devices import DeviceParams, Placement, has_gpu_backend
from ggspec.runtime.gguf_meta import GGUFMeta, read_meta
from ggspec.runtime.preflight import check_model


def _load_error() -> str:
    """Why llama.cpp refused a file: its "error loading model: ..." line names the key or tensor,
    while the last error line only says "failed to load model"."""
    from ggspec.native.bindings import log_lines

    for text in reversed(log_lines()):
        if "error loading model:" in text:
            return text.split("error loading model:", 1)[1].strip()
    return last_log_error()


_TOKENIZER_THREW = -(2**31)  # patch 0008: llama.cpp's tokenizer threw (INT32_MIN)


class Model(OwnedHandle):
    """A loaded GGUF model. Use as a context manager or call `close()`."""

    def __init__(self, path: str | Path, n_gpu_layers: int = 0, what: str = "model",
                 placement: Placement | None = None, load_mtp: bool = False, dry: bool = False,
                 mmap: bool = True, repack: bool = True) -> None:
        """n_gpu_layers: layers offloaded to the devices (-1: all); placement: split mode, RPC
        workers, proportions, mirrored head (see ggspec.runtime.devices); load_mtp: load the
        multi-token-prediction (nextn) blocks too, which llama.cpp skips by default; dry: read
        the metadata only and simulate every allocation (llama.cpp's no_alloc, what its fit
        measures with): its contexts can be measured (runtime.footprint), never decoded; mmap:
        map the file (llama.cpp's default) rather than read it into buffers of its own; repack:
        let the CPU backend repack weights for its own kernels (llama.cpp's default; its tools'
        `--no-repack` is False)."""
        self.lc = load_bindings()
        self.meta: GGUFMeta = read_meta(path, what)  # validates the file before llama.cpp reads it
        check_model(self.meta, what)  # ... and every value llama.cpp would abort on
        self.path = Path(path)
        self.what = what
        self.n_gpu_layers = n_gpu_layers
        self.placement = placement or Placement()
        params = self.lc.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.load_mtp = load_mtp
        params.use_extra_bufts = repack
        self.load_mtp = load_mtp
        self.dry = dry
        if dry:
            params.no_alloc = True
        if dry or not mmap:
            params.load_mode = self.lc.LLAMA_LOAD_MODE_NONE
        self._device_params = DeviceParams(self.lc, self.placement)  # lives as long as the model
        self._device_params.apply(params)
        ptr = self.lc.llama_model_load_from_file(os.fsencode(self.path), params)  # any file name the OS takes
        if not ptr:
            why = _load_error()
            raise LlamaError(f"llama.cpp could not load the {what} model: {self.path}" + (f" ({why})" if why else ""))
        self.ptr = ptr
        self.vocab = self.lc.llama_model_get_vocab(ptr)
        self.n_embd: int = self.lc.llama_model_n_embd(ptr)
        self.n_layer: int = self.lc.llama_model_n_layer(ptr)
        self.n_vocab: int = self.lc.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train: int = self.lc.llama_model_n_ctx_train(ptr)
        self.is_recurrent: bool = bool(
            self.lc.llama_model_is_recurrent(ptr) or self.lc.llama_model_is_hybrid(ptr)
        )
        self._pieces: dict[int, bytes] = {}  # token_bytes, looked up once per token id
        self._eog: dict[int, bool] = {}  # is_eog, likewise
        self.draft_vocab: np.ndarray | None = None  # token ids of a reduced draft vocabulary (set_draft_vocab)

    @property
    def head_on_device(self) -> bool:
        """Whether the output head runs off the host: on a GPU or an RPC worker (llama.cpp places
        it there with every layer, -ngl above n_layer or -1)."""
        offloaded = self.n_gpu_layers < 0 or self.n_gpu_layers > self.n_layer
        return offloaded and (self.placement.multi_device or has_gpu_backend())

    @property
    def mirrored_output(self) -> bool:
        """Whether llama.cpp keeps the output head whole on every device of a tensor split."""
        return bool(self.lc._lib.ggspec_model_meta_mirror_output(self.ptr))

    @property
    def arch(self) -> str:
        return self.meta.arch

    # --- tokenizer -------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> np.ndarray:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (ctypes.c_int32 * n_max)()
        n = self._tokenize(data, buf, n_max, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (ctypes.c_int32 * n_max)()
            n = self._tokenize(data, buf, n_max, add_special, parse_special)
        return np.frombuffer(buf, dtype=np.int32, count=n).copy()

    def _tokenize(self, data: bytes, buf, n_max: int, add_special: bool, parse_special: bool) -> int:
        n = self.lc._lib.ggspec_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n == _TOKENIZER_THREW:
            raise InputError(f"{self.what} {self.path}: its vocabulary cannot encode this text (it lacks the byte "
                             "tokens llama.cpp falls back to for characters outside it)")
        return n

    def token_bytes(self, token: int) -> bytes:
        """The bytes of one token's text (a server detokenizes every generated token: cached)."""
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._piece(token)
        return piece

    def _piece(self, token: int, special: bool = False) -> bytes:
        """One token's bytes; `special`: control tokens as their text (else nothing), as
        llama.cpp's common_token_to_piece."""
        if not 0 <= token < self.n_vocab:
            raise InputError(f"token id {token} is outside the {self.what}'s vocabulary (0..{self.n_vocab - 1})")
        buf = ctypes.create_string_buffer(64)
        n = self.lc._lib.ggspec_token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0 and n != _TOKENIZER_THREW:
            buf = ctypes.create_string_buffer(-n)
            n = self.lc._lib.ggspec_token_to_piece(self.vocab, token, buf, -n, 0, special)
        if n == _TOKENIZER_THREW:
            raise InputError(f"{self.what} {self.path}: llama.cpp cannot turn token {token} into text")
        return buf.raw[:n]

    def detokenize(self, tokens) -> str:
        return b"".join(self.token_bytes(int(t)) for t in tokens).decode("utf-8", "replace")

    def special_piece(self, token: int) -> bytes:
        """A token's bytes with control tokens written out (`<eos>`, `<|im_end|>`): what
        llama-server's /tokenize pieces and /detokenize show."""
        return self._piece(token, special=True)

    def is_eog(self, token: int) -> bool:
        """Whether a token ends generation (asked of every committed token: cached)."""
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(self.lc.llama_vocab_is_eog(self.vocab, token))
        return eog

    def set_draft_vocab(self, ids: np.ndarray | None) -> None:
        """Give the model a reduced draft vocabulary: a compacted copy of these token ids' rows of
        its output head (built once, on the head's device), which a chained MTP draft
        (patch 0011) or a context set to it (Context.set_head_rows, patch 0014) then scores
        instead of every row. None drops it."""
        ids = np.ascontiguousarray(ids if ids is not None else [], dtype=np.int32)
        rc = self.lc._lib.ggspec_model_set_draft_vocab(self.ptr, ids.ctypes.data, len(ids))
        if rc != 0:
            why = {-1: "the model has no output head", -2: f"a token id is outside 0..{self.n_vocab - 1}",
                   -3: "its output head cannot be copied (repacked CPU weights or a split head)"}
            raise InputError(f"cannot build the reduced draft vocabulary: {why.get(rc, f'error {rc}')}",
                             field="spec_draft_vocab")
        self.draft_vocab = ids if len(ids) else None

    # --- lifetime --------------------------------------------------------------------------------

    def _free(self, ptr) -> None:
        self._pieces.clear()  # a closed model answers nothing, cached or not
        self._eog.clear()
        self.lc.llama_model_free(ptr)
