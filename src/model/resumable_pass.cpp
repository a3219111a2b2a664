// The blocking driver of a resumable pass.
#include "src/model/resumable_pass.h"

namespace rlf {

void run_to_end(ResumablePass pass) {
  PassState state;
  pass.start(state);
  while (!pass.done()) {
    SplitPhaseChain& chain = pass.waiting_on();
    progress_until_finished(chain, {&chain});
    pass.resume();
  }
}

}  // namespace rlf
