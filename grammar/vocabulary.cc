#include <algorithm>
#include <numeric>

#include <xxhash.h>

#include "grammar/grammar.h"

namespace kvfleet::grammar {

struct Vocabulary::Data {
  std::vector<std::string> bytes;
  std::vector<int32_t> stop_ids;
  std::vector<char> stop;
  std::vector<char> usable;
  std::vector<int32_t> sorted;
  std::vector<int32_t> rank;
  std::vector<uint32_t> first;  // 257 offsets into sorted
  std::string blob;             // the sorted tokens' bytes, concatenated
  std::vector<uint32_t> blob_offset;
  std::vector<uint32_t> lcp;
  size_t max_bytes = 0;
  uint64_t fingerprint = 0;
};

Vocabulary::Vocabulary() {
  auto d = std::make_shared<Data>();
  d->first.assign(257, 0);
  d_ = std::move(d);
}

Vocabulary Vocabulary::FromTokenBytes(std::vector<std::string> bytes, std::vector<int32_t> stop_ids,
                                      std::vector<int32_t> special_ids) {
  auto d = std::make_shared<Data>();
  size_t n = bytes.size();
  d->bytes = std::move(bytes);
  d->stop.assign(n, 0);
  d->usable.assign(n, 1);
  std::sort(stop_ids.begin(), stop_ids.end());
  stop_ids.erase(std::unique(stop_ids.begin(), stop_ids.end()), stop_ids.end());
  for (int32_t id : stop_ids) {
    if (id >= 0 && static_cast<size_t>(id) < n) {
      d->stop[id] = 1;
      d->usable[id] = 0;
      d->stop_ids.push_back(id);
    }
  }
  for (int32_t id : special_ids) {
    if (id >= 0 && static_cast<size_t>(id) < n) d->usable[id] = 0;
  }
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  for (size_t i = 0; i < n; ++i) {
    if (d->bytes[i].empty()) d->usable[i] = 0;
    if (d->usable[i]) d->sorted.push_back(static_cast<int32_t>(i));
    d->max_bytes = std::max(d->max_bytes, d->bytes[i].size());
    uint64_t len = d->bytes[i].size() * 4 + d->usable[i] * 2 + d->stop[i];
    XXH3_64bits_update(h, &len, sizeof(len));
    XXH3_64bits_update(h, d->bytes[i].data(), d->bytes[i].size());
  }
  d->fingerprint = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  std::sort(d->sorted.begin(), d->sorted.end(), [&](int32_t a, int32_t b) { return d->bytes[a] < d->bytes[b]; });
  d->blob_offset.push_back(0);
  for (size_t i = 0; i < d->sorted.size(); ++i) {
    const std::string& t = d->bytes[d->sorted[i]];
    uint32_t l = 0;
    if (i > 0) {
      const std::string& p = d->bytes[d->sorted[i - 1]];
      while (l < p.size() && l < t.size() && p[l] == t[l]) ++l;
    }
    d->lcp.push_back(l);
    d->blob += t;
    d->blob_offset.push_back(static_cast<uint32_t>(d->blob.size()));
  }
  d->rank.assign(n, -1);
  for (size_t i = 0; i < d->sorted.size(); ++i) d->rank[d->sorted[i]] = static_cast<int32_t>(i);
  d->first.assign(257, 0);
  for (int32_t id : d->sorted) ++d->first[static_cast<uint8_t>(d->bytes[id][0]) + 1];
  std::partial_sum(d->first.begin(), d->first.end(), d->first.begin());
  Vocabulary v;
  v.d_ = std::move(d);
  return v;
}

size_t Vocabulary::size() const { return d_->bytes.size(); }
const std::string& Vocabulary::token(int32_t id) const { return d_->bytes[id]; }
bool Vocabulary::is_stop(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < size() && d_->stop[id]; }
bool Vocabulary::is_usable(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < size() && d_->usable[id]; }
std::span<const int32_t> Vocabulary::stop_ids() const { return d_->stop_ids; }
std::span<const int32_t> Vocabulary::sorted_ids() const { return d_->sorted; }
std::span<const uint32_t> Vocabulary::first_byte_offsets() const { return d_->first; }
int32_t Vocabulary::rank(int32_t id) const { return d_->rank[id]; }
std::string_view Vocabulary::sorted_token(int32_t rank) const {
  return std::string_view(d_->blob).substr(d_->blob_offset[rank], d_->blob_offset[rank + 1] - d_->blob_offset[rank]);
}
uint32_t Vocabulary::lcp_with_previous(int32_t rank) const { return d_->lcp[rank]; }
size_t Vocabulary::max_token_bytes() const { return d_->max_bytes; }
uint64_t Vocabulary::fingerprint() const { return d_->fingerprint; }

}  // namespace kvfleet::grammar
