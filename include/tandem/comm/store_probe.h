#pragma once
// Whether what listens at a store's address is a c10d TCPStore, asked before c10d's own client is given the
// address. That client trusts its peer: it reads whatever comes back as its answers, so another service's bytes
// (an SSH or SMTP banner, at once or half a second after the connection) become a length of gigabytes, and
// LibTorch 1.13 dies of std::bad_alloc (on a thread of c10d's where nothing can catch it); and it waits for an
// answer without a deadline. The probe speaks the store's own protocol under a deadline instead: one request that
// every TCPStore server answers with bytes the probe chose, and that leaves nothing in the store
// (compat::store_echo_request).
#include <chrono>
#include <string>

namespace tandem::comm {

struct StoreProbe {
  enum class Verdict {
    kStore,       // it answered the request as a c10d store does
    kNoSuchHost,  // the resolver definitely does not know the host
    kNoConnection,  // nothing accepted the connection (refused, unreachable, not within the timeout)
    kSilent,      // it accepted the connection and sent nothing back within the timeout
    kNotAStore,   // it sent bytes no store sends, or closed the connection without an answer
  };
  Verdict verdict = Verdict::kNoConnection;
  // Why, for a message: "Connection refused", "it accepted the connection but did not answer within 2.0 s",
  // "it answered as no c10d store does ("SSH-2.0-OpenSSH_9.2p1"): another service listens there".
  std::string why;
};

// Connects to host:port and sends the probe's request, all within `timeout`.
StoreProbe probe_store(const std::string& host, int port, std::chrono::milliseconds timeout);

}  // namespace tandem::comm
