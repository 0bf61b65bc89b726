// The request of Contract 4's test vectors (schema/transfer_vectors.txt): the two blocks of
// tokens 1..16 at B = 4 (hash_vectors.txt, row 1). The codec's tests and its fuzzer use it.
#pragma once

#include "schema/transfer_codec.h"

namespace kvfleet::testing {

inline transfer::PullRequest ExampleRequest() {
  transfer::PullRequest r;
  r.transfer_id = 7;
  r.model = "meta-llama/Llama-3.1-8B-Instruct";
  r.block_size = 4;
  r.hashes = {0x276a80ee59a83ca7ULL, 0x48a3b26c8ba2c36dULL};
  r.layout.dtype = transfer::KvDtype::kBf16;
  r.layout.block_size = 4;
  r.layout.pools = {transfer::PoolGeometry{0, 2, 1, 2, 64}};
  r.deadline_ms = 2000;
  return r;
}

}  // namespace kvfleet::testing
