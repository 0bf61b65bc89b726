#include <atomic>

#include "kernels/launch.h"

namespace kvfleet::kernels {
namespace {
std::atomic<bool> g_pdl{true};
}  // namespace

void SetProgrammaticDependentLaunch(bool enabled) { g_pdl.store(enabled, std::memory_order_relaxed); }
bool ProgrammaticDependentLaunch() { return g_pdl.load(std::memory_order_relaxed); }

}  // namespace kvfleet::kernels
