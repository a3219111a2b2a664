// Recorded router statistics: the text format bench balance replays, and its errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "src/balance/routing_trace.h"

namespace rlf {
namespace {

// A file in a directory of this test process (ctest runs tests in parallel processes).
std::string write_file(const std::string& name, const std::string& text) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("rlfusion-balance-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(RoutingTraceFile, ReadsStepsAndRejectsBadLines) {
  const auto trace = read_routing_trace(write_file("good.csv", "# e0,e1,e2\n1,2,3\n\n4, 5 ,6\n"));
  ASSERT_EQ(trace.size(), 2u);
  EXPECT_EQ(trace[1], (std::vector<double>{4, 5, 6}));
  EXPECT_THROW(read_routing_trace(write_file("field.csv", "1,2,3\n1,x,3\n")), ConfigError);
  EXPECT_THROW(read_routing_trace(write_file("negative.csv", "1,2,3\n1,-2,3\n")), ConfigError);
  EXPECT_THROW(read_routing_trace(write_file("width.csv", "1,2,3\n1,2\n")), ConfigError);
  EXPECT_THROW(read_routing_trace(write_file("short.csv", "1,2,3\n")), ConfigError);
  EXPECT_THROW(read_routing_trace("/nonexistent/rlfusion/trace.csv"), ConfigError);
  try {
    read_routing_trace(write_file("named.csv", "1,2\n3,4\n5,6,7\n"));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(std::filesystem::path(write_file("x", "")).parent_path());
}

// What `report --routing-trace` writes reads back as the same table, the comment skipped.
TEST(RoutingTraceFile, WrittenTextReadsBackExactly) {
  const std::vector<std::vector<double>> steps = {{17, 0, 0, 1}, {20, 0.5, 0, 1}, {1e9, 3, 2, 1}};
  const std::string text = routing_trace_text(steps, "from a trace\nsecond line");
  EXPECT_EQ(text.rfind("# from a trace\n# second line\n17,0,0,1\n", 0), 0u) << text;
  EXPECT_EQ(read_routing_trace(write_file("written.csv", text)), steps);
  std::filesystem::remove_all(std::filesystem::path(write_file("x", "")).parent_path());
}

}  // namespace
}  // namespace rlf
