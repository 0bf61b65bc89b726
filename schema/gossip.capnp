# Router gossip: what each router of one fleet knows only for itself, sent to the fleet's
# other routers (docs/DESIGN.md, "Routers that act as one"; schema/README.md, Contract 5).
# Append-only: never renumber, retype or reuse a field; add new fields at the end.
@0xa90908868f044ab0;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("kvfleet::schema");

# The sender's requests in flight on one worker, as its Fleet::OwnLoad counts them.
struct WorkerInflight {
  worker @0 :Text;          # the worker's workerId (its Hello's): every router knows it by it
  requests @1 :UInt32;      # in flight, first token or not
  waiting @2 :UInt32;       # of those, without a first token yet
  prefillTokens @3 :UInt64; # tokens the sender expects uncached, for the waiting ones
  promptTokens @4 :UInt64;  # the waiting ones' whole prompts
}

# The uncached prefill tokens per second the sender routes to one model's fleet lately (its
# DecayedRate, router/routing/work_rate.h).
struct ModelWork {
  model @0 :Text;
  prefillTokensPerSecond @1 :Float64;
}

# One frame on a router's gossip PUB socket: the sender's whole state, not a change to it, so
# a lost frame costs nothing but staleness. A worker it does not list has none of its requests.
struct RouterGossip {
  routerId @0 :Text;        # the sender's name, unique in the fleet (its gossip endpoint)
  incarnation @1 :UInt64;   # random at the sender's start: a restarted router is a new peer
  seq @2 :UInt64;           # 1, 2, ... within an incarnation; older or repeated ones are refused
  workers @3 :List(WorkerInflight);
  models @4 :List(ModelWork);
}
