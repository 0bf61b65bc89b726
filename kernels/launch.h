// How kvfleet's kernels are launched: programmatic dependent launch (PDL, Hopper).
//
// With PDL on, each launcher marks its kernel as allowed to start while the previous kernel
// in the stream is still running (cudaLaunchAttributeProgrammaticStreamSerialization). The
// kernel reads only constants (weights, the step's metadata uploaded before the first
// kernel) until it has executed griddepcontrol.wait, which returns once the previous kernel
// has completed and its memory is visible; every kernel triggers its dependents at its
// start (griddepcontrol.launch_dependents). So a matrix product streams its first weights
// while the small kernel before it runs, and no launch drains the GPU before the next one
// fills it. Stream capture keeps these as programmatic edges of the CUDA graph.
// Kernels launched without PDL (the prefill attention, cuBLASLt, copies) keep full stream
// order, before and after.
//
// Thread safety: the setting is one process-wide atomic, read at each launch.
#pragma once

namespace kvfleet::kernels {

// Default true. false: every launcher uses plain stream order (for A/B measurements and
// for debugging a suspected ordering problem).
void SetProgrammaticDependentLaunch(bool enabled);
bool ProgrammaticDependentLaunch();

}  // namespace kvfleet::kernels
