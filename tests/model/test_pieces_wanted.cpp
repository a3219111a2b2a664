// pieces_wanted() (src/model/resumable_pass.h): a pass learns whether anything runs at its progress
// points, so that it cuts its expert FFN into pieces only for a paired driver (one call otherwise,
// the same bits: tests/model/test_expert_pieces.cpp); asking never stops the pass.
#include <gtest/gtest.h>

#include "src/model/resumable_pass.h"

namespace rlf {
namespace {

ResumablePass asks(bool* wanted) {
  *wanted = co_await pieces_wanted();
}

TEST(PiecesWanted, OnlyWhenADriverRunsAtTheProgressPoints) {
  for (const bool driven : {false, true}) {
    SCOPED_TRACE(driven ? "paired driver" : "no driver");
    bool wanted = !driven;
    PassState state;
    if (driven) state.between_pieces = [] {};
    ResumablePass pass = asks(&wanted);
    pass.start(state);
    EXPECT_TRUE(pass.done());
    EXPECT_EQ(wanted, driven);
  }
}

}  // namespace
}  // namespace rlf
