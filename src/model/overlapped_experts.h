// Chunked, overlapped expert parallelism for the routed experts of one MoE layer (the Adaptive
// Pipe idea, without a second weight copy). This rank's tokens are split into `chunks` contiguous
// pieces (from three chunks on, the first and last half the size of the others: they are the
// pipeline's fill and drain), each with its own ExpertDispatcher (each keeps its chunk's routing
// plan for backward). Forward: while chunk i's expert FFN computes, chunk i+1's dispatch and
// chunk i-1's combine are in flight, and the compute loop calls progress between pieces of the
// FFN (Open MPI moves nonblocking transfers only inside MPI calls). Backward does the same with
// combine_backward and dispatch_backward. chunks = 1 is the plain path: blocking dispatch, compute,
// blocking combine.
//
// Results: every token's output and dx, and dexpert_weight, are computed row by row with the
// arithmetic of the un-chunked path (bit for bit when the FFN kernel's rows do not depend on how
// many rows it gets, as with the reference kernels); the expert weight gradients sum the rows
// chunk by chunk, so they equal the un-chunked ones up to float reassociation.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "mpi_comm/expert_dispatch.h"
#include "src/model/resumable_pass.h"

namespace rlf {

class Arena;

// This rank's local experts: E_local pointers each to w1, w3 [F, C] and w2 [C, F] (MoeWeights').
struct LocalExperts {
  const float *const *w1, *const *w3, *const *w2;
};
struct LocalExpertGradients {
  float *const *w1, *const *w3, *const *w2;
};

class OverlappedExperts {
 public:
  // Collective over ep.comm (one dispatcher per chunk, each with `redundant_slots` spare slots
  // per rank: the local experts are then E / P + R slots). Throws ConfigError (on every rank) when
  // chunks < 1 or the dispatcher rejects the layout.
  OverlappedExperts(const HierarchicalComm& ep, Links& links, int experts, DispatchMode mode,
                    int chunks, int d_model, int d_ff, const Ops<float>& ops, Arena& scratch,
                    double intra_node_bandwidth = 0, int redundant_slots = 0);

  int chunks() const { return int(chunks_.size()); }
  const ExpertDispatcher& dispatcher(int chunk) const { return *chunks_[size_t(chunk)].dispatcher; }
  // Expert migration: every chunk's dispatcher routes by this expert -> slot table
  // (ExpertDispatcher::set_expert_slots; between operations, the same table on every rank).
  void set_expert_slots(const std::vector<int>& slot_of);
  // The same with replicas: the expert in every slot (ExpertDispatcher::set_slot_experts); each
  // chunk's dispatcher splits a replicated expert's assignments of its chunk over the replicas.
  void set_slot_experts(const std::vector<int>& slot_expert);
  // Router statistics of every chunk since the last take, summed (by expert id).
  std::vector<int64_t> take_expert_tokens();

  // Collective. out[N, C] (written) = sum over k of expert_weight[n, k] * FFN_{expert_idx[n, k]}
  // (x[n]), the experts run by their owners. Keeps what backward needs; expert_weight must stay
  // valid until backward.
  void forward(const LocalExperts& w, const float* x, const int* expert_idx,
               const float* expert_weight, int N, int K, float* out);
  // Collective, after forward: dx[N, C] += the input gradient; dexpert_weight[N, K] written; the
  // local experts' gradients accumulated into g.
  void backward(const LocalExperts& w, const LocalExpertGradients& g, const float* dout, float* dx,
                float* dexpert_weight);
  // The same two as resumable passes (src/model/resumable_pass.h, for a MoE layer inside a pass
  // run as a pair): each stops where the blocking ones wait for a chunk's exchange, with the other
  // chunks' exchanges in flight for the driver to progress, and offers a progress point after
  // every piece of the FFN. The blocking ones run these to the end; the arithmetic is the same.
  ResumablePass forward_pass(const LocalExperts& w, const float* x, const int* expert_idx,
                             const float* expert_weight, int N, int K, float* out);
  ResumablePass backward_pass(const LocalExperts& w, const LocalExpertGradients& g,
                              const float* dout, float* dx, float* dexpert_weight);

  // Where the last forward + backward spent its time outside the FFN: waiting for transfers (the
  // exposed communication), and inside the progress calls between pieces (MPI's work on the
  // compute core: matching, and for large messages the shared-memory copy itself).
  struct Overhead {
    double waiting = 0, progressing = 0;
  };
  const Overhead& overhead() const { return time_; }

  // The expert FFN forward and backward of every chunk without communication, on the rows and
  // upstream gradients of the last forward + backward: the compute part of a step alone, for
  // measuring it.
  void compute_only(const LocalExperts& w, const LocalExpertGradients& g);
  // Collective. The four exchanges of a step, chunk by chunk and blocking, with no computation
  // (the dispatched rows stand in for the expert outputs and their gradients): the communication
  // part of a step alone. Replaces what forward kept.
  void communicate_only(const float* x, const int* expert_idx, const float* expert_weight, int N,
                        int K, const float* dout);

 private:
  struct Chunk {
    std::unique_ptr<ExpertDispatcher> dispatcher;
    int first_token = 0, tokens = 0;
    std::vector<float> xg, a, b, y, dy, dxg;  // this rank's rows of the chunk
    std::vector<int> offsets;                 // local expert offsets of the rows
  };
  // The FFN of one chunk in pieces of at most kRowsPerPiece rows of one expert, driving every
  // chunk's transfers after each piece: a rendezvous message needs a progress call on both
  // sides, and a dispatch is several messages one after another, so the pieces must be small
  // enough for the next chunk's dispatch to finish during this chunk's compute; smaller pieces
  // cost GEMM efficiency and progress calls (bench overlap defaults: 32 and 64 rows did worse).
  static constexpr int kRowsPerPiece = 128;
  // Pieces of at most kRowsPerPiece rows of one local expert: (expert, first row, rows).
  struct Piece {
    int expert;
    int64_t first;
    int rows;
  };
  std::vector<Piece> pieces(const Chunk& chunk) const;
  // One piece of the chunk's FFN forward or backward (pieces() order).
  void forward_piece(const LocalExperts& w, Chunk& chunk, const Piece& piece);
  void backward_piece(const LocalExperts& w, const LocalExpertGradients& g, Chunk& chunk,
                      const Piece& piece);
  // The chunk's FFN piece by piece, driving every chunk's transfers after each piece and offering
  // the pass's driver a progress point.
  ResumablePass compute_forward(const LocalExperts& w, Chunk& chunk);
  ResumablePass compute_backward(const LocalExperts& w, const LocalExpertGradients& g,
                                 Chunk& chunk);
  int first_token_of_chunk(int N, int chunk) const;  // chunk == chunks(): N
  void drive();
  // Stops the pass until the chunk's exchange has finished (the others in flight progressed).
  ResumablePass wait(Chunk& chunk);

  std::vector<Chunk> chunks_;
  std::vector<SplitPhaseChain*> chains_;
  const Ops<float>& ops_;
  Arena& scratch_;
  int C_, F_, K_ = 0, N_ = 0;
  const float* expert_weight_ = nullptr;
  Overhead time_;
};

}  // namespace rlf
