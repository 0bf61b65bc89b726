// Where one JSON object or array ends in text that arrives a byte at a time, without
// parsing it: the depth outside strings, and strings with their escapes. Whether the text is
// valid JSON is for a parser to say once it has ended; this only finds the end, so a
// streamed value can go out as it is written. O(1) state, one step per byte.
//
// Thread safety: a value type, owned by the stream that feeds it.
#pragma once

namespace kvfleet::router {

class JsonEndScanner {
 public:
  // Takes the next byte; true when it closed the outermost value.
  // REQUIRES: the first byte is '{' or '['; no byte after the one that returned true.
  bool Push(char c) {
    if (in_string_) {
      if (escape_) escape_ = false;
      else if (c == '\\') escape_ = true;
      else if (c == '"') in_string_ = false;
      return false;
    }
    switch (c) {
      case '"': in_string_ = true; break;
      case '{':
      case '[': ++depth_; break;
      case '}':
      case ']': return --depth_ == 0;
      default: break;
    }
    return false;
  }
  bool in_string() const { return in_string_; }

 private:
  int depth_ = 0;
  bool in_string_ = false, escape_ = false;
};

}  // namespace kvfleet::router
