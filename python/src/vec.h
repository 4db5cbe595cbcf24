// python/src/vec.h — the lists of vectored operations, read from arrays in C++ (no Python loop
// per entry), and their buffers.
//
// A list comes either as entries (a NumPy array of dtype dmx.IO_ENTRY / IO_PIECE, copied with one
// memcpy, or an integer array of shape (n, 5) / (n, 3)) or as blocks: arrays of offsets and lengths
// applied to each buffer of a list (the layout of a paged KV cache: block ids times the block
// size, for every layer's tensor). Integer arrays are anything with the buffer protocol whose items
// are integers (NumPy, array.array, memoryview), a CPU torch tensor (through .numpy()) or a list of
// ints; any width, signed or not, any strides; negative values are refused with their index. Raises
// dmx.InvalidArgumentError naming the argument and, for a bad value, its index. With the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <span>
#include <string>
#include <vector>

#include "dmx/endpoint.h"
#include "future.h"

namespace dmxpy {

// The buffers of a vectored operation: `obj` one buffer or a list/tuple of them.
struct Buffers {
  Keep keep;                         // one BufferRef each, held until the operation completes
  std::vector<dmx::MemRegion> regions;
};
Buffers acquire_buffers(pybind11::handle obj, bool writable, const char* what);

// `obj` one descriptor (bytes, RemoteRegion) or a list/tuple of them.
std::vector<dmx::RemoteRegion> remote_regions(pybind11::handle obj, const char* what);

// A list of IoEntry, built or copied from the arrays (never used in place: the post releases the
// GIL, and another thread could change an array while dmx checks it).
class EntryList {
 public:
  EntryList() = default;
  EntryList(const EntryList&) = delete;
  EntryList& operator=(const EntryList&) = delete;

  // `entries`: an IO_ENTRY array or an integer array of shape (n, 5): local index, remote index,
  // local offset, remote offset, length.
  static void from_entries(EntryList& out, pybind11::handle entries);
  // Every buffer i (of `locals`) with remote region i (or 0 when there is one): for each i, the n
  // blocks local_offsets[j] -> remote_offsets[j] of lengths[j] (or one length for all), buffer by
  // buffer.
  static void from_blocks(EntryList& out, size_t locals, size_t remotes, pybind11::handle local_offsets,
                          pybind11::handle remote_offsets, pybind11::handle lengths);
  std::span<const dmx::IoEntry> span() const { return span_; }

 private:
  std::vector<dmx::IoEntry> owned_;
  std::span<const dmx::IoEntry> span_;
};

// The same for IoPiece (send_vec, recv_vec): an IO_PIECE array or integers of shape (n, 3):
// buffer index, offset, length; or blocks: offsets[j], lengths[j] for each buffer in turn.
class PieceList {
 public:
  PieceList() = default;
  PieceList(const PieceList&) = delete;
  PieceList& operator=(const PieceList&) = delete;

  static void from_pieces(PieceList& out, pybind11::handle pieces);
  static void from_blocks(PieceList& out, size_t locals, pybind11::handle offsets, pybind11::handle lengths);
  std::span<const dmx::IoPiece> span() const { return span_; }

 private:
  std::vector<dmx::IoPiece> owned_;
  std::span<const dmx::IoPiece> span_;
};

}  // namespace dmxpy
