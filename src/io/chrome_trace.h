// A trace as a Chrome / Perfetto timeline (the JSON "Trace Event Format"): open it in
// https://ui.perfetto.dev or chrome://tracing. One process per rank, one track (thread) per phase
// kind, each event a complete slice carrying its tokens, bytes and policy version; counter tracks
// per rank for device memory in use and for the bytes the rank moved so far.
#pragma once

#include <string>

#include "src/io/trace_reader.h"

namespace rlf {

// The timeline as one JSON document (times in microseconds since the trace's epoch).
std::string chrome_trace_json(const TraceData& trace);

// Writes chrome_trace_json(trace) to `path` under a temporary name first, then renames it, so an
// existing file is replaced whole or not at all. Throws ConfigError naming `path` on failure.
void write_chrome_trace(const std::string& path, const TraceData& trace);

}  // namespace rlf
