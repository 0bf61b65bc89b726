// ThreadSanitizer cannot see libzmq's synchronisation: the Debian libzmq is not instrumented,
// and its lock-free pipes hand message buffers from the ZMQ I/O thread to the socket's owner
// with atomics TSan never observes. Every recv()/memcpy its I/O thread does then looks like a
// race with the thread that reads the message. Ignoring the accesses libzmq makes through
// intercepted calls (recv, memcpy, ...) removes exactly those reports; races in our own code
// are still reported. Linked into the tests that use ZMQ sockets.
#if defined(__SANITIZE_THREAD__)
extern "C" const char* __tsan_default_suppressions() {
  // libsodium decrypts CURVE traffic in place for libzmq's I/O thread: the same hand-off.
  // A message's metadata ("User-Id", set by the ZAP handler) is a string libzmq's I/O thread
  // allocates at the handshake and hands over the same way; the registration socket's
  // reader (the fleet thread alone) is where it is read.
  // A zero-copy frame a KV transfer holder sends is freed by libzmq's I/O thread once
  // written (FreeSentFrame), after the same unseen hand-off.
  return "called_from_lib:libzmq.so.5\ncalled_from_lib:libsodium.so.23\n"
         "race:kvfleet::router::Registration::Drain\nrace:FreeSentFrame\n";
}
#endif
