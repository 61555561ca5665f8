#pragma once
// Which of this machine's addresses the others can reach it at. A machine has several (loopback, one per
// interface, namespaces with their own), and the name it calls itself often resolves to loopback (Debian maps
// it to 127.0.1.1 in /etc/hosts, containers often to 127.0.0.1): a backend that binds that address is
// unreachable from the other nodes. The address the kernel would send from to reach the rendezvous master is
// one every node can reach, since they all reach the master over the same networks.
#include <string>

namespace tandem::comm {

// The local address (IPv4 or IPv6, as text) that this machine's routing table uses to reach `host`, a name or
// an address. Asks the kernel by connecting a UDP socket, which sends nothing. Throws CommError naming `host`,
// and GLOO_SOCKET_IFNAME as the way around, when the name does not resolve or no route leads there.
std::string local_address_toward(const std::string& host);

}  // namespace tandem::comm
