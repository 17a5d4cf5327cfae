"""Pre-packed Warp CPU launches: a recorded launch turned into one ctypes call, and moved to other arrays.

``wp.Launch.launch()`` on the CPU rebuilds the kernel's argument struct on every call (a ``setattr`` per argument,
about 15-25 us for the simulator's kernels). A control step replays 28 forward and 28 adjoint launches, and with
the batch split across threads this Python time is serialised by the GIL while the kernels themselves run in
parallel. :func:`pack` builds the struct once: calling the result is a direct call of the compiled kernel on the
same struct Warp would build (Warp's own ``_build_cpu_args_structs``), so results are the same bits.

Packing itself costs about 0.2 ms per launch (Warp's ``wp.launch`` argument handling), 11 ms per array set of a
control step: paid for every new set, it made the first gradient rollout of a process 2-3x slower than the next.
Array sets of the same shape differ only in where their arrays are, so :class:`Relocatable` keeps one set's packed
launches and derives the others' by adding the distance between the buffers to the pointer fields of a copy of
the structs.

:class:`TensorLaunch` goes one step further for launches whose arrays change on every call (fresh torch tensors):
it writes the tensors' data pointers into the packed struct and calls the kernel, so no tensor is copied into a
pooled array first and no result is copied out of one.

Anything this cannot prove equivalent (a CUDA launch, a cooperative CPU launch with ``block_dim > 1``, an argument
type other than plain arrays and values, a Warp without the helper) falls back to ``cmd.launch`` (and is not
relocatable).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["PackedLaunch", "Relocatable", "TensorLaunch", "pack", "prepack"]


class PackedLaunch:
    """A recorded CPU launch as its argument structs: call it to run the kernel (forward, or adjoint when packed
    from an ``adjoint=True`` launch)."""

    def __init__(self, hook: Any, bounds: Any, args: ctypes.Structure, adj_args: ctypes.Structure | None):
        self.hook, self.bounds, self.args, self.adj_args = hook, bounds, args, adj_args
        refs = [ctypes.byref(bounds), ctypes.byref(args)]  # byref keeps the structs alive with the partial
        if adj_args is not None:
            refs.append(ctypes.byref(adj_args))
        self.call: Callable[[], None] = functools.partial(hook, *refs)

    def __call__(self) -> None:
        self.call()


def _array_pointer_words(struct: ctypes.Structure) -> list[int] | None:
    """Indices (in 8-byte words) of the ``data`` and ``grad`` pointers of every array argument of a packed struct;
    None if the struct holds an argument type whose pointers this does not know (then it cannot be relocated)."""
    from warp._src.types import array_t

    words = []
    for name, ftype in type(struct)._fields_:
        offset = getattr(type(struct), name).offset
        if issubclass(ftype, array_t):
            for sub in ("data", "grad"):
                at = offset + getattr(array_t, sub).offset
                if at % 8:
                    return None
                words.append(at // 8)
        elif issubclass(ftype, ctypes.Structure) and not _plain(ftype):
            return None  # a struct with pointers (indexed array, Warp struct): not relocatable
    return words


def _plain(ftype: type) -> bool:
    """A ctypes structure made of numbers only (Warp's vector, matrix, quaternion and transform values)."""
    for _, t in getattr(ftype, "_fields_", ()):
        if issubclass(t, ctypes.Structure):
            if not _plain(t):
                return False
        elif issubclass(t, ctypes.Array):
            if not issubclass(t._type_, (ctypes.c_float, ctypes.c_double, ctypes.c_int32, ctypes.c_uint32,
                                         ctypes.c_int16, ctypes.c_uint16, ctypes.c_int8, ctypes.c_uint8,
                                         ctypes.c_int64, ctypes.c_uint64)):
                return False
        elif t in (ctypes.c_void_p, ctypes.c_char_p):
            return False
    return True


class Relocatable:
    """The packed launches of one array set, re-targetable to sets of the same layout in other buffers.

    ``ranges``: the ``(start, nbytes)`` of each buffer the launches' arrays may point into. :meth:`at` gives the
    launches with every array pointer inside range ``j`` moved by ``deltas[j]`` bytes; pointers elsewhere (the
    model's shared arrays, absent gradients) are kept. Only the ``data`` / ``grad`` fields of Warp's ``array_t``
    arguments are touched, found from the structs' field types (not by value), so no other number can be taken
    for a pointer. All the structs of the set live in one byte string, so moving them is one copy and one
    vectorised add; :meth:`calls` then hands out direct calls into that copy (20 us for a control step's 32 forward
    launches; 70 us when a ctypes struct is built per launch, as :meth:`at` does; about 6 ms when Warp packs them).
    """

    def __init__(self, launches: Sequence[PackedLaunch], ranges: Sequence[tuple[int, int]]):
        self.n_ranges = len(ranges)
        parts, words, self._slots = [], [], []
        offset = 0
        for p in launches:
            slot = [p.hook, p.bounds]
            for struct in (p.args, p.adj_args):
                if struct is None:
                    slot.append(None)
                    continue
                pointers = _array_pointer_words(struct)
                if pointers is None:
                    raise ValueError("launch has arguments whose pointers cannot be relocated")
                size = ctypes.sizeof(struct)
                padded = -(-size // 8) * 8  # every struct starts on an 8-byte word
                parts.append(bytes(struct) + bytes(padded - size))
                words += [offset // 8 + w for w in pointers]
                slot.append((type(struct), offset))
                offset += padded
            self._slots.append(tuple(slot))
        self._blob = b"".join(parts)
        index = np.asarray(words, dtype=np.intp)
        values = np.frombuffer(self._blob, dtype=np.int64)[index]
        self._picks = [index[(values >= start) & (values < start + size)] for start, size in ranges]

    def _moved(self, deltas: Sequence[int]) -> ctypes.Array:
        """A copy of the structs' bytes with the pointers in range ``j`` moved by ``deltas[j]``."""
        if len(deltas) != self.n_ranges:
            raise ValueError(f"expected {self.n_ranges} deltas, got {len(deltas)}")
        buf = (ctypes.c_char * len(self._blob)).from_buffer_copy(self._blob)
        words = np.frombuffer(buf, dtype=np.int64)
        for idx, d in zip(self._picks, deltas):
            if d and idx.size:
                words[idx] += d
        return buf

    def calls(self, deltas: Sequence[int]) -> list[Callable[[], None]]:
        """The launches on the arrays moved by ``deltas`` (bytes, one per range), as zero-argument callables.

        The same calls as :meth:`at`'s, without building a ctypes struct per launch: each callable passes the
        kernel pointers into one moved copy of the structs (``ctypes.byref`` with an offset, which keeps the copy
        alive). This is what a new array set pays in the calling thread while the blocks wait: about 15 us per
        control step's launches, against 0.2 ms for :meth:`at`.
        """
        buf = self._moved(deltas)
        byref, partial = ctypes.byref, functools.partial
        out = []
        for hook, bounds, args, adj in self._slots:
            if adj is None:
                out.append(partial(hook, byref(bounds), byref(buf, args[1])))
            else:
                out.append(partial(hook, byref(bounds), byref(buf, args[1]), byref(buf, adj[1])))
        return out

    def at(self, deltas: Sequence[int]) -> list[PackedLaunch]:
        """The launches on the arrays moved by ``deltas`` (bytes, one per range), as :class:`PackedLaunch` structs
        (to inspect them; :meth:`calls` is the cheaper way to run them)."""
        buf = self._moved(deltas)  # the structs below are views of it and keep it alive
        out = []
        for hook, bounds, args, adj in self._slots:
            out.append(PackedLaunch(hook, bounds, args[0].from_buffer(buf, args[1]),
                                    None if adj is None else adj[0].from_buffer(buf, adj[1])))
        return out


def pack(cmd: Any) -> PackedLaunch | None:
    """The recorded launch ``cmd`` (from ``wp.launch(..., record_cmd=True)``) as a :class:`PackedLaunch`, or None
    where that is not provably the same call (then replay ``cmd.launch``).

    The arrays ``cmd`` was recorded with must stay alive and in place (the struct holds their pointers), which is the
    same requirement replaying ``cmd`` itself has.
    """
    try:
        from warp._src.context import _build_cpu_args_structs
    except ImportError:  # a Warp that moved the helper: keep its own replay
        return None
    device = getattr(cmd, "device", None)
    if device is None or not device.is_cpu or getattr(cmd, "block_dim", 1) > 1:
        return None
    hook = cmd.hooks.backward if cmd.adjoint else cmd.hooks.forward
    if hook is None:
        return None  # Warp raises its own error on launch
    args, adj_args = _build_cpu_args_structs(cmd.kernel, cmd.hooks, cmd.params, cmd.adjoint)
    return PackedLaunch(hook, cmd.params[0], args, adj_args if cmd.adjoint else None)


def prepack(cmd: Any) -> Callable[[], None]:
    """A zero-argument callable that runs the recorded launch ``cmd``: :func:`pack`'s direct call where possible,
    else ``cmd.launch``."""
    packed = pack(cmd)
    return cmd.launch if packed is None else packed.call


def _array_offset(struct_type: type, name: str) -> int | None:
    """Byte offset of the Warp ``array_t`` named ``name`` in a packed argument struct: a kernel argument, or
    ``"arg.field"`` for an array field of a Warp struct argument (embedded in the argument struct); None if there is
    no such array."""
    from warp._src.types import array_t

    offset, ftype = 0, struct_type
    for part in name.split("."):
        fields = dict(getattr(ftype, "_fields_", ()))
        if part not in fields:
            return None
        offset += getattr(ftype, part).offset
        ftype = fields[part]
    return offset if isinstance(ftype, type) and issubclass(ftype, array_t) else None


class TensorLaunch:
    """A packed CPU launch whose named array arguments point at the caller's torch tensors on every call.

    ``cmd``: a launch recorded with ``record_cmd=True`` on template Warp arrays; ``bound``: the names of the kernel
    arguments to rebind, each with its template array (the expected layout); ``"arg.field"`` names an array field of
    a Warp struct argument. A call ``launch(t_1, ..., t_k)`` takes
    one CPU tensor per name, in order, with the template's dtype and shape (``wp.to_torch`` of the template). The
    tensors may be strided views (rows of a wider tensor, one body of a [N, nb, 3, 3] block) as long as each
    element of the Warp dtype (a vec3, a mat33) is contiguous: the call writes the tensors' data pointers and
    strides into the packed struct, one vectorised store each, and calls the kernel. Anything else raises before
    the kernel runs, since a wrong layout would be read or written as if it were right.

    With ``rows=True`` the launch is one-dimensional over the bound arrays' first dimension: a call may pass ``n``
    rows, up to the recorded launch size, and runs ``n`` threads on arrays of ``n`` rows (arguments not named keep
    their recorded arrays, which must have at least ``n`` rows where the kernel indexes them by row).

    ``views``: arguments that are column ranges of a bound two-dimensional argument, ``(name, template, source,
    column)``: the argument is the source's columns from ``column`` on (as many as the template's element or row
    holds), e.g. a vec3 array of a state's columns 0:3, or its columns 7: as a float array, without a torch view
    per call. A vec3 (or other vector) view needs the source's columns contiguous.
    """

    def __init__(self, cmd: Any, bound: Sequence[tuple[str, Any]], rows: bool = False,
                 views: Sequence[tuple[str, Any, str, int]] = ()):
        import warp as wp
        from warp._src.types import array_t

        packed = pack(cmd)
        if packed is None:
            raise ValueError("TensorLaunch needs a plain CPU launch (see pack)")
        # its own copy of the launch bounds: rows=True rewrites them, and they belong to cmd
        bounds = type(packed.bounds).from_buffer_copy(packed.bounds)
        self._packed = packed = PackedLaunch(packed.hook, bounds, packed.args, packed.adj_args)
        struct = packed.args
        size = ctypes.sizeof(struct)
        if size % 8:
            raise ValueError("the packed argument struct is not a whole number of 8-byte words")
        raw = (ctypes.c_char * size).from_address(ctypes.addressof(struct))
        self._words, self._ints = np.frombuffer(raw, dtype=np.int64), np.frombuffer(raw, dtype=np.int32)
        self.rows = bool(rows)
        self.max_rows = int(packed.bounds.size)
        if self.rows and len(packed.bounds.shape) != 1:
            raise ValueError("TensorLaunch(rows=True) needs a one-dimensional launch")
        ptr_index, stride_index, shape_index, self._expect = [], [], [], []
        for name, template in [*bound, *((v[0], v[1]) for v in views)]:
            offset = _array_offset(type(struct), name)
            if offset is None:
                raise ValueError(f"{name!r} is not an array argument of kernel {cmd.kernel.key!r}")
            data = offset + array_t.data.offset
            if data % 8:
                raise ValueError(f"the data pointer of {name!r} is not 8-byte aligned in the struct")
            ptr_index.append(data // 8)
            outer = template.ndim
            stride_index += [(offset + array_t.strides.offset) // 4 + k for k in range(outer)]
            shape_index.append((offset + array_t.shape.offset) // 4)
            view = wp.to_torch(template)
            if self.rows and view.shape[0] != self.max_rows:
                raise ValueError(f"{name!r} has {view.shape[0]} rows, the launch {self.max_rows}")
            inner = view.shape[outer:]
            contiguous = tuple(int(np.prod(inner[k + 1:], dtype=np.int64)) for k in range(len(inner)))
            self._expect.append((name, tuple(view.shape[1:]), view.shape[0], view.dtype, outer, contiguous,
                                 view.element_size()))
        self._ptr_index = np.asarray(ptr_index, dtype=np.intp)
        self._stride_index = np.asarray(stride_index, dtype=np.intp)
        self._shape_index = np.asarray(shape_index, dtype=np.intp)
        names = [name for name, _ in bound]
        self._views = []  # (source index, byte offset, its own outer dims: 1 (vector rows) or 2 (the source's))
        for name, _, source, column in views:
            if source not in names:
                raise ValueError(f"view {name!r}: {source!r} is not a bound argument")
            j = names.index(source)
            _, src_shape, _, src_dtype, src_outer, _, itemsize = self._expect[j]
            _, shape, _, dtype, outer, _, _ = self._expect[len(self._views) + len(names)]
            width = int(np.prod(shape, dtype=np.int64))
            if src_outer != 2 or src_dtype != dtype or outer not in (1, 2) or column < 0 or \
                    column + width > src_shape[0]:
                raise ValueError(f"view {name!r} of shape {list(shape)} does not fit in columns {column}: of "
                                 f"{source!r} ({list(src_shape)} {src_dtype})")
            self._views.append((j, column * itemsize, outer, itemsize))
        self._expect = self._expect[:len(names)]
        # per argument: the layouts (rows, shape, strides, dtype, on the CPU) already checked -> their byte strides
        self._seen: list[dict[tuple, tuple[int, ...]]] = [{} for _ in self._expect]
        self._last: tuple[int, list[int]] | None = None  # (rows, strides) written by the previous call

    def _check(self, j: int, n: int, t: Any) -> tuple[int, ...]:
        """The outer byte strides of tensor ``t`` for argument ``j`` (``n`` rows), or a ValueError."""
        name, shape, first, dtype, outer, inner, itemsize = self._expect[j]
        st = t.stride()
        if (t.dim() != len(shape) + 1 or tuple(t.shape[1:]) != shape or t.shape[0] != (n if self.rows else first)
                or t.dtype != dtype or not t.is_cpu or st[outer:] != inner):
            raise ValueError(f"{name}: expected a CPU {dtype} tensor of shape {[n if self.rows else first, *shape]} "
                             f"whose elements are contiguous, got {list(t.shape)} {t.dtype} on {t.device} with "
                             f"strides {list(st)}")
        return tuple(k * itemsize for k in st[:outer])

    def __call__(self, *tensors: Any) -> None:
        if len(tensors) != len(self._expect):
            raise ValueError(f"expected {len(self._expect)} tensors, got {len(tensors)}")
        n = tensors[0].shape[0] if self.rows and tensors[0].dim() else self.max_rows
        if not 1 <= n <= self.max_rows:
            raise ValueError(f"the launch takes 1 to {self.max_rows} rows, got {n}")
        ptrs, strides, bytes_strides = [], [], []
        for j, (t, seen) in enumerate(zip(tensors, self._seen)):
            key = (n, t.shape, t.stride(), t.dtype, t.is_cpu)  # a layout is checked once, then looked up
            got = seen.get(key)
            if got is None:
                got = seen[key] = self._check(j, n, t)
            ptrs.append(t.data_ptr())
            strides += got
            bytes_strides.append(got)
        for j, offset, outer, itemsize in self._views:
            got = bytes_strides[j]
            if outer == 1 and got[1] != itemsize:
                raise ValueError(f"{self._expect[j][0]}: a vector view needs its columns contiguous, got strides "
                                 f"{list(got)} bytes")
            ptrs.append(ptrs[j] + offset)
            strides += got if outer == 2 else got[:1]
        self._words[self._ptr_index] = ptrs
        if self._last is None or self._last[0] != n or self._last[1] != strides:
            self._ints[self._stride_index] = strides
            if self.rows:
                self._ints[self._shape_index] = n
                self._packed.bounds.shape[0] = n
                self._packed.bounds.size = n
            self._last = (n, strides)
        self._packed.call()
