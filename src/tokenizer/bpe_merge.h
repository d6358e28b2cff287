// The merge loop of byte-level BPE, shared by GPT-2's tokenizer and tokenizer.json's.
//
// A piece starts as one part per byte. Repeatedly, of all adjacent pairs of parts that can merge,
// the one of lowest merge rank merges, the leftmost of equal ranks, until no pair can. The two
// tokenizers differ only in which pairs can merge and at what rank, which `merge_of` answers:
//   - tiktoken (GPT-2): a pair merges if the concatenated bytes are a token; its rank is its id;
//   - tokenizers (tokenizer.json): a pair merges if the pair of ids is in the merge list; the rank
//     is the line of the list, and the merged token's id is whatever the vocabulary gives it.
// A heap of candidate pairs makes this O(n log n) in the piece length (tiktoken's loop is O(n^2)),
// which matters for long runs without spaces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace layup {

struct BpeMerge {
  int32_t rank = -1;  // -1: the pair does not merge
  int32_t id = -1;    // the merged token
};

// Appends the ids of the merged parts to `ids`. part_ids holds the id of each byte of the piece
// (at least one). merge_of(start, end, left_id, right_id) says whether two adjacent parts that
// together cover bytes [start, end), with ids left_id and right_id, merge.
template <class MergeOf>
void merge_bpe_parts(std::vector<int32_t> part_ids, MergeOf merge_of, std::vector<int32_t>& ids) {
  const size_t n = part_ids.size();
  // Parts are named by their first byte. part_end[start] is 0 once the part was merged into the
  // one on its left (a live part always ends after 0).
  std::vector<size_t> part_end(n), part_before(n);
  for (size_t i = 0; i < n; ++i) {
    part_end[i] = i + 1;
    part_before[i] = i - 1;  // unused for i == 0
  }

  struct Candidate {  // merging the part at start with the next one, into the token id
    int32_t rank;
    size_t start;
    int32_t id;
    auto operator<=>(const Candidate&) const = default;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> candidates;
  const auto merge_at = [&](size_t start) {
    const size_t middle = part_end[start];
    return merge_of(start, part_end[middle], part_ids[start], part_ids[middle]);
  };
  const auto consider = [&](size_t start) {
    const BpeMerge merge = merge_at(start);
    if (merge.rank >= 0) candidates.push({merge.rank, start, merge.id});
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(i);

  while (!candidates.empty()) {
    const Candidate best = candidates.top();
    candidates.pop();
    // A candidate is stale once a part it names has merged with another. As tokenizers does, it
    // still counts if the pair now at its place merges into the same token: the id is checked, not
    // the rank. (Under tiktoken's rule the same token means the same bytes, so the same pair.)
    const size_t middle = part_end[best.start];
    if (middle == 0 || middle >= n || merge_at(best.start).id != best.id) continue;

    part_end[best.start] = part_end[middle];
    part_ids[best.start] = best.id;
    part_end[middle] = 0;
    if (part_end[best.start] < n) {
      part_before[part_end[best.start]] = best.start;
      consider(best.start);
    }
    if (best.start > 0) consider(part_before[best.start]);
  }
  for (size_t start = 0; start < n; start = part_end[start]) ids.push_back(part_ids[start]);
}

// Where each piece's ids were first appended to a text's ids: [begin, end).
using PieceIdRanges = std::unordered_map<std::string_view, std::pair<size_t, size_t>>;

// Appends the ids of `piece` to `ids`: a copy of its ids where the text had it before (most
// pieces of a long text repeat), else encode_piece(piece, ids), remembered in `seen`.
template <class EncodePiece>
void append_piece_ids(std::string_view piece, PieceIdRanges& seen, std::vector<int32_t>& ids,
                      EncodePiece encode_piece) {
  const auto [cached, inserted] = seen.try_emplace(piece, ids.size(), 0);
  if (!inserted) {
    const auto [begin, end] = cached->second;
    for (size_t i = begin; i < end; ++i) {
      const int32_t id = ids[i];  // a copy: push_back may reallocate
      ids.push_back(id);
    }
    return;
  }
  encode_piece(piece, ids);
  cached->second.second = ids.size();
}

}  // namespace layup
