// A StaleSync sample in flight across steps: generated in part (or finished while its group is
// not), kept in a rank's rollout pool. A checkpoint saves every rank's, so a restart continues
// them exactly: the prompt follows from the prompt id, the sampler's randomness from the sample
// id, and a partial's KV cache is recomputed at the next phase anyway.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace rlf {

struct InFlightSample {
  int64_t prompt_id = 0;
  int32_t member = 0;  // in its prompt's group (sample id = prompt id x group size + member)
  bool finished = false;
  int32_t version_min = 0;  // meaningful once the response is not empty
  int32_t version_max = 0;
  std::vector<int32_t> response;      // tokens generated so far
  std::vector<float> behaviour_logp;  // one per response token

  bool operator==(const InFlightSample&) const = default;
};

// Samples as three flat arrays, for MPI messages and HDF5 datasets: a row of kColumns integers
// per sample (prompt id, member, finished, version_min, version_max, response length), then the
// responses' tokens and log-probs concatenated.
struct PackedInFlight {
  static constexpr int kColumns = 6;
  std::vector<int64_t> rows;
  std::vector<int32_t> tokens;
  std::vector<float> logp;

  static PackedInFlight pack(const std::vector<InFlightSample>& samples) {
    PackedInFlight p;
    for (const InFlightSample& s : samples) {
      p.rows.insert(p.rows.end(), {s.prompt_id, s.member, s.finished ? 1 : 0, s.version_min,
                                   s.version_max, int64_t(s.response.size())});
      p.tokens.insert(p.tokens.end(), s.response.begin(), s.response.end());
      p.logp.insert(p.logp.end(), s.behaviour_logp.begin(), s.behaviour_logp.end());
    }
    return p;
  }

  // Response tokens the rows announce; std::invalid_argument when a length is negative.
  static int64_t announced_tokens(const int64_t* rows, size_t count) {
    if (count % kColumns != 0) throw std::invalid_argument("in-flight rows are not whole");
    int64_t total = 0;
    for (size_t at = 0; at < count; at += kColumns) {
      if (rows[at + 5] < 0) throw std::invalid_argument("negative in-flight response length");
      total += rows[at + 5];
    }
    return total;
  }

  // The samples of `count` row values starting at `rows`, their tokens and log-probs starting at
  // `tokens` and `logp` (as many as announced_tokens says).
  static std::vector<InFlightSample> unpack(const int64_t* rows, size_t count,
                                            const int32_t* tokens, const float* logp) {
    std::vector<InFlightSample> samples;
    int64_t at_token = 0;
    for (size_t at = 0; at + kColumns <= count; at += kColumns) {
      const int64_t* row = rows + at;
      InFlightSample s;
      s.prompt_id = row[0];
      s.member = int32_t(row[1]);
      s.finished = row[2] != 0;
      s.version_min = int32_t(row[3]);
      s.version_max = int32_t(row[4]);
      s.response.assign(tokens + at_token, tokens + at_token + row[5]);
      s.behaviour_logp.assign(logp + at_token, logp + at_token + row[5]);
      at_token += row[5];
      samples.push_back(std::move(s));
    }
    return samples;
  }
};

}  // namespace rlf
