#include "src/runtime/pipeline_generation.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kernels/arena.h"
#include "src/runtime/posted_sends.h"

namespace rlf {

namespace {

constexpr int kTag = 7311;

// What a message carries. Prefill and Decode: the hidden rows entering virtual stage `stage`
// (prefill: every token of the group's prompts; decode: one row per running sequence). Tokens:
// the next token of each running sequence, to the first stage. Done: the group has finished.
enum class Kind : int32_t { Prefill, Decode, Tokens, Done };

struct Header {
  Kind kind;
  int32_t group, stage, rows;
};

// One message: the header, the rows' cache slots and positions (the position of the token a
// decode step feeds), then the hidden rows (floats) or the tokens (ints).
struct Message {
  Header header{};
  const int32_t* slots = nullptr;
  const int32_t* positions = nullptr;
  const void* payload = nullptr;
  size_t payload_bytes = 0;
};

std::vector<char> pack(const Header& h, const int* slots, const int* positions, const void* payload,
                       size_t payload_bytes) {
  const size_t ints = 2 * size_t(h.rows) * sizeof(int32_t);
  std::vector<char> out(sizeof(Header) + ints + payload_bytes);
  char* at = out.data();
  std::memcpy(at, &h, sizeof(Header));
  at += sizeof(Header);
  if (h.rows > 0) {
    std::memcpy(at, slots, size_t(h.rows) * sizeof(int32_t));
    std::memcpy(at + size_t(h.rows) * sizeof(int32_t), positions, size_t(h.rows) * sizeof(int32_t));
  }
  at += ints;
  if (payload_bytes > 0) std::memcpy(at, payload, payload_bytes);
  return out;
}

Message unpack(const std::vector<char>& buffer, size_t bytes) {
  Message m;
  std::memcpy(&m.header, buffer.data(), sizeof(Header));
  const char* at = buffer.data() + sizeof(Header);
  m.slots = reinterpret_cast<const int32_t*>(at);
  m.positions = m.slots + m.header.rows;
  const size_t used = sizeof(Header) + 2 * size_t(m.header.rows) * sizeof(int32_t);
  m.payload = buffer.data() + used;
  m.payload_bytes = bytes - used;
  return m;
}

// Every sample's tokens, log-probs and end flag, from `root` to every rank of `comm`, counted on
// `links` as the root's sends of the count and the packed samples to each other rank.
void broadcast_samples(std::vector<GeneratedSample>& samples, int root, MPI_Comm comm,
                       Links& links) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::vector<int32_t> packed;
  if (rank == root) {
    for (const GeneratedSample& s : samples) {
      packed.push_back(int32_t(s.tokens.size()));
      packed.push_back(s.ended ? 1 : 0);
      packed.insert(packed.end(), s.tokens.begin(), s.tokens.end());
      const size_t at = packed.size();
      packed.resize(at + s.logprobs.size());
      std::memcpy(packed.data() + at, s.logprobs.data(), s.logprobs.size() * sizeof(float));
    }
  }
  int64_t count = int64_t(packed.size());
  MPI_Bcast(&count, 1, MPI_INT64_T, root, comm);
  packed.resize(size_t(count));
  MPI_Bcast(packed.data(), int(count), MPI_INT32_T, root, comm);
  if (rank == root) {
    int size = 0;
    MPI_Comm_size(comm, &size);
    for (int r = 0; r < size; ++r) {
      if (r != root) {
        links.count_send(links.world_rank_of(r, comm),
                         sizeof(count) + uint64_t(count) * sizeof(int32_t));
      }
    }
    return;
  }
  size_t at = 0;
  for (GeneratedSample& s : samples) {
    const size_t n = size_t(packed[at]);
    s.ended = packed[at + 1] != 0;
    s.tokens.assign(packed.begin() + std::ptrdiff_t(at + 2),
                    packed.begin() + std::ptrdiff_t(at + 2 + n));
    s.logprobs.resize(n);
    std::memcpy(s.logprobs.data(), packed.data() + at + 2 + n, n * sizeof(float));
    at += 2 + 2 * n;
  }
}

}  // namespace

int pipeline_prefill_pieces(int group_sequences, bool expert_parallel) {
  return expert_parallel ? kPipelinePrefillPieces
                         : std::max(1, std::min(kPipelinePrefillPieces, group_sequences));
}

std::vector<GeneratedSample> generate_pipelined(Transformer<float>& stage,
                                                const std::vector<LayerRange>& chunks,
                                                const std::vector<std::vector<int>>& prompts,
                                                const std::vector<int64_t>& sample_ids,
                                                const GenerationSettings& settings,
                                                MPI_Comm pipeline, Links& links,
                                                BatchOccupancy* occupancy) {
  int rank = 0, P = 0;
  MPI_Comm_rank(pipeline, &rank);
  MPI_Comm_size(pipeline, &P);
  const int B = int(prompts.size());
  if (P < 2 || chunks.empty() || sample_ids.size() != prompts.size() || !settings.use_kv_cache) {
    throw std::invalid_argument(
        "generate_pipelined: needs a pipeline of 2 or more stages, the rank's chunks, one sample "
        "id per prompt and the KV cache");
  }
  // With expert parallelism every pass is collective over the stage's EP group (this stage in
  // other pipelines), so a pipeline with nothing to generate still takes part.
  const bool expert_parallel = stage.expert_parallel();
  std::vector<GeneratedSample> out(static_cast<size_t>(B));
  if (B == 0 && !expert_parallel) return out;
  int longest = 0;
  for (const auto& p : prompts) {
    if (p.empty()) throw std::invalid_argument("generate_pipelined: empty prompt");
    longest = std::max(longest, int(p.size()));
  }
  const int max_len = generation_length(stage, longest, settings, "generate_pipelined");
  const int C = stage.config().d_model;
  const int stages = P * int(chunks.size());  // virtual stages
  const int next = (rank + 1) % P, previous = (rank + P - 1) % P;
  const int previous_world = links.world_rank_of(previous, pipeline);
  PostedSends sends(pipeline, kTag, links);

  // The groups: about B / P consecutive sequences each, every sequence's cache slot its index.
  // (With EP always P, some empty if B < P, and always kPipelinePrefillPieces prefill pieces: the
  // EP mates' passes must pair up.)
  const int M = expert_parallel ? P : std::min(P, B);
  std::vector<int> group_first(static_cast<size_t>(M) + 1);
  for (int g = 0; g <= M; ++g) group_first[size_t(g)] = int(int64_t(g) * B / M);
  auto prefill_pieces = [&](int g) {
    return pipeline_prefill_pieces(group_first[size_t(g) + 1] - group_first[size_t(g)],
                                   expert_parallel);
  };
  // The last stage's rows of each group still to run after its prefill pieces so far, and the
  // pieces it still waits for.
  struct PrefillPending {
    std::vector<int> slots, positions, tokens;
    int pieces_left = 0;
  };
  std::vector<PrefillPending> prefilled(static_cast<size_t>(M));
  for (int g = 0; g < M; ++g) prefilled[size_t(g)].pieces_left = prefill_pieces(g);
  size_t largest_message = 0;
  int largest_group = 0;
  for (int g = 0; g < M; ++g) {
    int64_t tokens = 0;
    for (int b = group_first[size_t(g)]; b < group_first[size_t(g) + 1]; ++b)
      tokens += int64_t(prompts[size_t(b)].size());
    const int rows = group_first[size_t(g) + 1] - group_first[size_t(g)];
    largest_group = std::max(largest_group, rows);
    largest_message = std::max(largest_message, sizeof(Header) + 2 * size_t(rows) * sizeof(int) +
                                                    size_t(tokens) * size_t(C) * sizeof(float));
  }
  if (occupancy) occupancy->capacity = std::max(occupancy->capacity, largest_group);

  Arena& device = stage.device();
  ArenaScope scope(device);
  KVCache<float> cache = stage.allocate_kv_cache(B, max_len);
  const Arena::Mark after_cache = device.mark();

  // The last stage's view of each sequence: the sample so far and its length.
  std::vector<int> length(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) length[size_t(b)] = int(prompts[size_t(b)].size());

  // Virtual stage s over the message's rows (slots, positions; hidden rows x_in, or tokens on the
  // first virtual stage), then what follows: the hidden rows on to the next rank, or the next
  // tokens back to the first stage.
  auto run_stage = [&](Kind kind, int group, int s, const std::vector<int>& slots,
                       const std::vector<int>& positions, const float* x_in, const int* tokens) {
    const auto began = std::chrono::steady_clock::now();
    const LayerRange range = chunks[size_t(s / P)];
    const int rows = int(slots.size());
    const float* result = nullptr;
    std::vector<int> packed, offsets{0};
    if (kind == Kind::Prefill) {
      for (int slot : slots) {
        const std::vector<int>& p = prompts[size_t(slot)];
        if (s == 0) packed.insert(packed.end(), p.begin(), p.end());
        offsets.push_back(offsets.back() + int(p.size()));
      }
      result = stage.prefill_range(cache, s == 0 ? packed.data() : nullptr, x_in, offsets.data(),
                                   rows, slots.data(), range.first, range.last);
    } else {
      result = stage.decode_range(cache, tokens, x_in, slots.data(), positions.data(), rows,
                                  range.first, range.last);
    }
    if (s + 1 < stages) {
      const int hidden_rows = kind == Kind::Prefill ? offsets.back() : rows;
      sends.post(next, pack({kind, group, s + 1, rows}, slots.data(), positions.data(), result,
                            size_t(hidden_rows) * size_t(C) * sizeof(float)));
    } else {
      // The head's logits: the next token of every row.
      std::vector<int> next_tokens(static_cast<size_t>(rows)), at(static_cast<size_t>(rows));
      std::vector<int64_t> ids(static_cast<size_t>(rows));
      std::vector<float> logp(static_cast<size_t>(rows));
      for (int i = 0; i < rows; ++i) {
        ids[size_t(i)] = sample_ids[size_t(slots[size_t(i)])];
        at[size_t(i)] = length[size_t(slots[size_t(i)])];
      }
      {
        ArenaScope sampling(device);
        sample_next_tokens(stage, next_tokens.data(), logp.data(), result, ids.data(), at.data(),
                           rows, settings);
      }
      std::vector<int> running, running_positions, running_tokens;
      for (int i = 0; i < rows; ++i) {
        const int b = slots[size_t(i)];
        GeneratedSample& sample = out[size_t(b)];
        sample.tokens.push_back(next_tokens[size_t(i)]);
        sample.logprobs.push_back(logp[size_t(i)]);
        length[size_t(b)] += 1;
        if (next_tokens[size_t(i)] == settings.eos_token) {
          sample.ended = true;
        } else if (int(sample.tokens.size()) < settings.max_new_tokens) {
          running.push_back(b);
          running_positions.push_back(length[size_t(b)] - 1);  // where the new token goes
          running_tokens.push_back(next_tokens[size_t(i)]);
        }
      }
      // A prefill piece: the group goes on once all of its pieces have come.
      bool step_ends = true;
      if (kind == Kind::Prefill) {
        PrefillPending& pending = prefilled[size_t(group)];
        pending.slots.insert(pending.slots.end(), running.begin(), running.end());
        pending.positions.insert(pending.positions.end(), running_positions.begin(),
                                 running_positions.end());
        pending.tokens.insert(pending.tokens.end(), running_tokens.begin(), running_tokens.end());
        step_ends = --pending.pieces_left == 0;
        if (step_ends) {
          running.swap(pending.slots);
          running_positions.swap(pending.positions);
          running_tokens.swap(pending.tokens);
        }
      }
      if (step_ends) {
        const int n = int(running.size());
        // With EP the group runs on, with no rows if need be, until it has finished in every
        // pipeline of the EP group: the mates' passes stay paired (the last stages agree after
        // each of the group's steps, in the same order on every mate).
        const bool runs_on = expert_parallel ? stage.on_any_expert_parallel_rank(n > 0) : n > 0;
        if (runs_on && occupancy) occupancy->group_decode_steps += 1;
        sends.post(next, runs_on ? pack({Kind::Tokens, group, 0, n}, running.data(),
                                        running_positions.data(), running_tokens.data(),
                                        size_t(n) * sizeof(int))
                                 : pack({Kind::Done, group, 0, 0}, nullptr, nullptr, nullptr, 0));
      }
    }
    device.release(after_cache);
    if (occupancy) {
      occupancy->add_step(
          rows, std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
    }
  };

  if (rank == 0) {
    for (int g = 0; g < M; ++g) {
      const int first = group_first[size_t(g)], size = group_first[size_t(g) + 1] - first;
      const int pieces = prefill_pieces(g);
      for (int piece = 0; piece < pieces; ++piece) {
        const int begin = first + size * piece / pieces, end = first + size * (piece + 1) / pieces;
        std::vector<int> slots(size_t(end - begin));
        std::iota(slots.begin(), slots.end(), begin);
        run_stage(Kind::Prefill, g, 0, slots, std::vector<int>(slots.size(), 0), nullptr, nullptr);
      }
    }
  }
  std::vector<char> buffer(std::max(largest_message, sizeof(Header) + 3 * size_t(B) * sizeof(int) +
                                                         size_t(B) * size_t(C) * sizeof(float)));
  int done = 0;
  while (done < M) {
    MPI_Request request;
    MPI_Status status;
    MPI_Irecv(buffer.data(), int(buffer.size()), MPI_BYTE, previous, kTag, pipeline, &request);
    wait_with_backoff(&request, &status);
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    links.emulate(previous_world, uint64_t(bytes));
    const Message m = unpack(buffer, size_t(bytes));
    const Header h = m.header;
    if (h.kind == Kind::Done) {
      ++done;
      if (rank != P - 1) sends.post(next, pack(h, nullptr, nullptr, nullptr, 0));
      continue;
    }
    const std::vector<int> slots(m.slots, m.slots + h.rows);
    const std::vector<int> positions(m.positions, m.positions + h.rows);
    if (h.kind == Kind::Tokens) {
      const std::vector<int> tokens(static_cast<const int*>(m.payload),
                                    static_cast<const int*>(m.payload) + h.rows);
      run_stage(Kind::Decode, h.group, 0, slots, positions, nullptr, tokens.data());
    } else {
      // The hidden rows into the device arena (the kernels read them there).
      const size_t floats = m.payload_bytes / sizeof(float);
      float* x = device.allocate<float>(floats, "pipeline generation rows");
      std::memcpy(x, m.payload, m.payload_bytes);
      run_stage(h.kind, h.group, h.stage, slots, positions, x, nullptr);
    }
  }
  sends.finish();
  broadcast_samples(out, P - 1, pipeline, links);
  return out;
}

std::vector<GeneratedSample> generate_own_prompts_pipelined(
    Transformer<float>& stage, const std::vector<LayerRange>& chunks,
    const std::vector<std::vector<int>>& prompts, const std::vector<int64_t>& sample_ids,
    const GenerationSettings& settings, MPI_Comm pipeline, Links& links,
    BatchOccupancy* occupancy) {
  int P = 0, rank = 0;
  MPI_Comm_size(pipeline, &P);
  MPI_Comm_rank(pipeline, &rank);
  // Every rank's prompt count, then the lengths, then the tokens and ids, in rank order.
  const int mine = int(prompts.size());
  std::vector<int> counts(static_cast<size_t>(P));
  MPI_Allgather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, pipeline);
  std::vector<int> displacements(static_cast<size_t>(P), 0);
  for (int r = 1; r < P; ++r)
    displacements[size_t(r)] = displacements[size_t(r) - 1] + counts[size_t(r) - 1];
  const int total = displacements.back() + counts.back();
  std::vector<int> my_lengths, lengths(static_cast<size_t>(total));
  std::vector<int> my_tokens;
  for (const auto& p : prompts) {
    my_lengths.push_back(int(p.size()));
    my_tokens.insert(my_tokens.end(), p.begin(), p.end());
  }
  MPI_Allgatherv(my_lengths.data(), mine, MPI_INT, lengths.data(), counts.data(),
                 displacements.data(), MPI_INT, pipeline);
  std::vector<int64_t> ids(static_cast<size_t>(total));
  MPI_Allgatherv(sample_ids.data(), mine, MPI_INT64_T, ids.data(), counts.data(),
                 displacements.data(), MPI_INT64_T, pipeline);
  std::vector<int> token_counts(static_cast<size_t>(P), 0),
      token_displacements(static_cast<size_t>(P), 0);
  for (int r = 0; r < P; ++r)
    for (int i = 0; i < counts[size_t(r)]; ++i)
      token_counts[size_t(r)] += lengths[size_t(displacements[size_t(r)] + i)];
  for (int r = 1; r < P; ++r)
    token_displacements[size_t(r)] =
        token_displacements[size_t(r) - 1] + token_counts[size_t(r) - 1];
  std::vector<int> tokens(size_t(token_displacements.back() + token_counts.back()));
  MPI_Allgatherv(my_tokens.data(), int(my_tokens.size()), MPI_INT, tokens.data(),
                 token_counts.data(), token_displacements.data(), MPI_INT, pipeline);
  // Counted on the links: this rank's count, lengths, ids and tokens to each other rank.
  const uint64_t contributed = sizeof(int) + uint64_t(mine) * (sizeof(int) + sizeof(int64_t)) +
                               uint64_t(my_tokens.size()) * sizeof(int);
  for (int r = 0; r < P; ++r)
    if (r != rank) links.count_send(links.world_rank_of(r, pipeline), contributed);
  std::vector<std::vector<int>> all(static_cast<size_t>(total));
  for (int b = 0, at = 0; b < total; at += lengths[size_t(b)], ++b)
    all[size_t(b)].assign(tokens.begin() + at, tokens.begin() + at + lengths[size_t(b)]);
  std::vector<GeneratedSample> samples =
      generate_pipelined(stage, chunks, all, ids, settings, pipeline, links, occupancy);
  return std::vector<GeneratedSample>(
      std::make_move_iterator(samples.begin() + displacements[size_t(rank)]),
      std::make_move_iterator(samples.begin() + displacements[size_t(rank)] + mine));
}

}  // namespace rlf
