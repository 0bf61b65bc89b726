// grammar_bench's two parts: the grammar engine's mask times (grammar_bench.cc) and the
// decode step with and without a grammar on a backend (--engine, grammar_engine_bench.cc).
#pragma once

namespace kvfleet::bench {

// The order JSON schema both parts constrain with (nested objects, enums, arrays, formats,
// patterns and free strings).
extern const char* const kOrderSchema;

// grammar_bench --engine ...: prints the step table; 0 on success.
int RunEngineBench(int argc, char** argv);

}  // namespace kvfleet::bench
