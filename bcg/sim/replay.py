"""Pre-packed Warp CPU launches: a recorded launch turned into one ctypes call, and moved to other arrays.

``wp.Launch.launch()`` on the CPU rebuilds the kernel's argument struct on every call (a ``setattr`` per argument,
about 15-25 us for the simulator's kernels). A control step replays 28 forward and 28 adjoint launches, and with
the batch split across threads this Python time is serialised by the GIL while the kernels themselves run in
parallel. :func:`pack` builds the struct once: calling the result is a direct call of the compiled kernel on the
same struct Warp would build (Warp's own ``_build_cpu_args_structs``), so results are the same bits.

Packing itself costs about 0.2 ms per launch (Warp's ``wp.launch`` argument handling), 11 ms per array set of a
control step: paid for every new set, it made the first gradient rollout of a process 2-3x slower than the next.
Array sets of the same shape differ only in where their arrays are, so :class:`Relocatable` packs one set's launch
and derives the others' by adding the distance between the buffers to the pointer fields of a copy of the
struct (a few microseconds).

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

__all__ = ["PackedLaunch", "Relocatable", "pack", "prepack"]


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
    """A packed launch on arrays in some buffers, re-targetable to the same layout in other buffers.

    ``ranges``: the ``(start, nbytes)`` of each buffer the launch's arrays may point into. :meth:`at` gives the
    launch with every array pointer inside range ``j`` moved by ``deltas[j]`` bytes; pointers elsewhere (the
    model's shared arrays, absent gradients) are kept. Only the ``data`` / ``grad`` fields of Warp's ``array_t``
    arguments are touched, found from the struct's field types (not by value), so no other number can be taken
    for a pointer.
    """

    def __init__(self, packed: PackedLaunch, ranges: Sequence[tuple[int, int]]):
        self.packed = packed
        self.n_ranges = len(ranges)
        self._select = []
        for struct in (packed.args, packed.adj_args):
            if struct is None:
                self._select.append(None)
                continue
            words = _array_pointer_words(struct)
            if words is None:
                raise ValueError("launch has arguments whose pointers cannot be relocated")
            values = np.frombuffer(struct, dtype=np.int64, count=ctypes.sizeof(struct) // 8)[words]
            picks = []
            for start, size in ranges:
                inside = (values >= start) & (values < start + size)
                picks.append(np.asarray(words, dtype=np.intp)[inside])
            self._select.append(picks)

    def at(self, deltas: Sequence[int]) -> PackedLaunch:
        """The launch on the arrays moved by ``deltas`` (bytes, one per range)."""
        if len(deltas) != self.n_ranges:
            raise ValueError(f"expected {self.n_ranges} deltas, got {len(deltas)}")
        moved = []
        for struct, picks in zip((self.packed.args, self.packed.adj_args), self._select):
            if struct is None:
                moved.append(None)
                continue
            copy = type(struct).from_buffer_copy(struct)
            words = np.frombuffer(copy, dtype=np.int64, count=ctypes.sizeof(copy) // 8)  # a view into the copy
            for idx, d in zip(picks, deltas):
                if d and idx.size:
                    words[idx] += d
            moved.append(copy)
        return PackedLaunch(self.packed.hook, self.packed.bounds, moved[0], moved[1])


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
