// Contract 3's Describe (schema/worker.capnp): how a worker the router was given by address
// (--workers, --workers-dns), which sends no Hello of its own, tells the router who it is.
// The router sends ToWorker.describe on the requests connection it opened; the worker
// answers there with FromWorker.hello, the Hello it would register with
// (schema/registration.h). A worker older than Describe drops the frame as malformed.
//
// These frames go through their own functions, not DecodeToWorker and DecodeFromWorker:
// the worker's request server checks IsDescribe before decoding a request, and only the
// router's fleet thread, which sends Describes on a socket of its own, reads the answers.
// Implemented beside the Hello's encoding, in registration.cc.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"
#include "schema/registration.h"

namespace kvfleet {

// The router's side.
std::string EncodeDescribe();
// An untrusted FromWorker frame: DataLoss when it does not decode or is not a Hello.
Result<WorkerHello> DecodeDescribed(const void* data, size_t size);

// The worker's side.
// True when a ToWorker frame is a Describe (false for anything else, a malformed frame too).
bool IsDescribe(const void* data, size_t size);
std::string EncodeDescribed(const WorkerHello& hello);

}  // namespace kvfleet
