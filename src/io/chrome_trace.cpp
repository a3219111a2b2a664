#include "src/io/chrome_trace.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string_view>
#include <system_error>
#include <vector>

#include "kernels/error.h"
#include "src/io/json_text.h"

namespace rlf {

namespace {

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", value);
  return text;
}

class EventList {
 public:
  explicit EventList(std::string& out) : out_(out) {}
  std::string& next() {
    out_ += first_ ? "\n" : ",\n";
    first_ = false;
    return out_;
  }

 private:
  std::string& out_;
  bool first_ = true;
};

// Appends the pieces in order (no temporaries of whole lines).
void append(std::string& out, std::initializer_list<std::string_view> pieces) {
  for (const std::string_view piece : pieces) out.append(piece);
}

double microseconds(double seconds) {
  return seconds * 1e6;
}

}  // namespace

std::string chrome_trace_json(const TraceData& trace) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"otherData\":{";
  bool first = true;
  for (const auto& [key, value] : trace.metadata) {
    append(out, {first ? "" : ",", json_string(key), ":", json_string(value)});
    first = false;
  }
  out += "},\"traceEvents\":[";
  EventList events(out);
  for (int r = 0; r < int(trace.ranks.size()); ++r) {
    const std::string pid = std::to_string(r);
    append(events.next(), {"{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":", pid,
                           ",\"args\":{\"name\":\"rank ", pid, "\"}}"});
    append(events.next(), {"{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":", pid,
                           ",\"args\":{\"sort_index\":", pid, "}}"});
    // A track per phase kind the rank used, named after the phase and ordered by Phase.
    std::vector<bool> used(kPhaseCount, false);
    for (const TraceEvent& e : trace.ranks[size_t(r)]) used[size_t(e.phase)] = true;
    for (int p = 0; p < kPhaseCount; ++p) {
      if (!used[size_t(p)]) continue;
      const std::string tid = std::to_string(p);
      append(events.next(), {"{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":", pid, ",\"tid\":",
                             tid, ",\"args\":{\"name\":\"", phase_name(Phase(p)), "\"}}"});
      append(events.next(), {"{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":", pid,
                             ",\"tid\":", tid, ",\"args\":{\"sort_index\":", tid, "}}"});
    }
    // Slices in begin order (recorded order is end order for nested scopes), then counters at
    // each event's end: memory in use, and the rank's bytes moved so far.
    std::vector<const TraceEvent*> by_begin;
    for (const TraceEvent& e : trace.ranks[size_t(r)]) by_begin.push_back(&e);
    std::stable_sort(by_begin.begin(), by_begin.end(),
                     [](const TraceEvent* a, const TraceEvent* b) { return a->begin < b->begin; });
    for (const TraceEvent* e : by_begin) {
      const char* name = phase_name(e->phase);
      std::string& line = events.next();
      append(line, {"{\"ph\":\"X\",\"name\":\"", name, "\",\"cat\":\"", name, "\",\"pid\":", pid,
                    ",\"tid\":", std::to_string(int(e->phase)),
                    ",\"ts\":", number(microseconds(e->begin)),
                    ",\"dur\":", number(microseconds(std::max(0.0, e->end - e->begin))),
                    ",\"args\":{\"tokens\":", std::to_string(e->tokens),
                    ",\"bytes\":", std::to_string(e->bytes)});
      if (e->version != kNoVersion) append(line, {",\"version\":", std::to_string(e->version)});
      line += "}}";
    }
    std::vector<const TraceEvent*> by_end = by_begin;
    std::stable_sort(by_end.begin(), by_end.end(),
                     [](const TraceEvent* a, const TraceEvent* b) { return a->end < b->end; });
    int64_t moved = 0;
    for (const TraceEvent* e : by_end) {
      const std::string ts = number(microseconds(e->end));
      if (e->memory_bytes > 0) {
        append(events.next(),
               {"{\"ph\":\"C\",\"name\":\"device memory\",\"pid\":", pid, ",\"ts\":", ts,
                ",\"args\":{\"MiB\":", number(double(e->memory_bytes) / 1048576.0), "}}"});
      }
      if (e->bytes > 0) {
        moved += e->bytes;
        append(events.next(), {"{\"ph\":\"C\",\"name\":\"bytes moved\",\"pid\":", pid, ",\"ts\":",
                               ts, ",\"args\":{\"MB\":", number(double(moved) / 1e6), "}}"});
      }
    }
  }
  out += "\n]}\n";
  return out;
}

void write_chrome_trace(const std::string& path, const TraceData& trace) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    if (!file) throw ConfigError("cannot write the timeline '" + path + "' (cannot create it)");
    file << chrome_trace_json(trace);
    file.close();
    if (!file) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      throw ConfigError("cannot write the timeline '" + path + "' (disk full?)");
    }
  }
  std::error_code code;
  std::filesystem::rename(temporary, path, code);
  if (code) {
    std::filesystem::remove(temporary, code);
    throw ConfigError("cannot write the timeline '" + path + "': " + code.message());
  }
}

}  // namespace rlf
