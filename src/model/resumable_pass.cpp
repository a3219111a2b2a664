// The blocking driver of a resumable pass.
#include "src/model/resumable_pass.h"

namespace rlf {

void run_to_end(ResumablePass pass) {
  PassState state;
  pass.start(state);
  while (!pass.done()) {
    progress_until_finished(pass.waiting_on(), pass.chains_to_progress());
    pass.resume();
  }
}

}  // namespace rlf
