#include "src/io/trace.h"

#include "kernels/arena.h"

namespace rlf {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::Generate:
      return "generate";
    case Phase::Score:
      return "score";
    case Phase::Reference:
      return "reference";
    case Phase::Train:
      return "train";
    case Phase::Optimizer:
      return "optimizer";
    case Phase::QueuePut:
      return "queue_put";
    case Phase::QueueGet:
      return "queue_get";
    case Phase::WeightSync:
      return "weight_sync";
    case Phase::GradientReduce:
      return "gradient_reduce";
    case Phase::Evaluate:
      return "evaluate";
    case Phase::Idle:
      return "idle";
    case Phase::Other:
      return "other";
    case Phase::Offload:
      return "offload";
    case Phase::Onload:
      return "onload";
    case Phase::Reshard:
      return "reshard";
    case Phase::Migrate:
      return "migrate";
    case Phase::Reorder:
      return "reorder";
    case Phase::Proximal:
      return "proximal";
  }
  return "unknown";
}

const char* link_traffic_name(int32_t link_class) {
  return link_class == 0 ? "intra_node" : link_class == 1 ? "inter_node" : "unknown";
}

TraceRecorder::TraceRecorder(MPI_Comm comm, size_t reserve_events) : enabled_(true) {
  // Reserved up front so that recording never allocates unless a run outgrows the reservation
  // (then the vector grows geometrically: amortized, never per event).
  events_.reserve(reserve_events);
  MPI_Barrier(comm);
  epoch_ = MPI_Wtime();
}

int64_t TraceRecorder::current_memory_bytes() const {
  return memory_source_ ? int64_t(memory_source_->used()) : 0;
}

}  // namespace rlf
