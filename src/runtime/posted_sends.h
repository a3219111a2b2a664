// Messages a rank sends without waiting for their receivers: the stages of a pipeline all send at
// once (a ring of blocking sends would wait on each other). Each send is counted on the Links
// (its receiver pays the emulated delay) and its buffer kept until the send has completed.
#pragma once

#include <mpi.h>

#include <list>
#include <vector>

#include "mpi_comm/links.h"

namespace rlf {

class PostedSends {
 public:
  PostedSends(MPI_Comm comm, int tag, Links& links) : comm_(comm), tag_(tag), links_(links) {}
  ~PostedSends() { finish(); }
  PostedSends(const PostedSends&) = delete;
  PostedSends& operator=(const PostedSends&) = delete;

  // Sends `message` to rank `to` of the communicator; frees the buffers of earlier sends that
  // have completed.
  void post(int to, std::vector<char> message);
  // Waits for every send posted.
  void finish();

 private:
  struct Pending {
    std::vector<char> bytes;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  MPI_Comm comm_;
  int tag_;
  Links& links_;
  std::list<Pending> pending_;
};

}  // namespace rlf
